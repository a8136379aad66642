//! A server-sent-events reader for the chat-completions stream: bytes in, the `data` of each
//! event out.
//!
//! It keeps only what the OpenAI stream uses: `data:` lines (several are joined with `\n`),
//! events ended by a blank line, comments (`:` lines, keep-alives) and other fields
//! ignored, and `\n`, `\r\n` or `\r` line ends, split across network chunks anywhere.

/// The longest line kept in memory; a server that sends more without a line end is broken.
const MAX_LINE: usize = 16 * 1024 * 1024;

/// Why the bytes are not an event stream.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SseError {
    /// A line is not UTF-8.
    #[error("a line is not utf-8")]
    Utf8,
    /// A line is longer than [`MAX_LINE`].
    #[error("a line is longer than {MAX_LINE} bytes")]
    LineTooLong,
}

/// Splits a byte stream into events, keeping what a chunk ends with until the next one.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    /// The bytes of the line in progress.
    line: Vec<u8>,
    /// The `data` of the event in progress, each line followed by `\n`.
    data: String,
    /// Whether the event in progress has a `data` field (an empty one counts).
    has_data: bool,
    /// Whether the last byte seen was a `\r`, so that a `\n` next completes the same line
    /// end.
    after_cr: bool,
}

impl SseParser {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Reads `bytes` and appends the data of every event they complete to `events`.
    pub(crate) fn push(&mut self, bytes: &[u8], events: &mut Vec<String>) -> Result<(), SseError> {
        let mut rest = bytes;
        if self.after_cr {
            self.after_cr = false;
            if let Some(after) = rest.strip_prefix(b"\n") {
                rest = after;
            }
        }
        while let Some(end) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.extend(&rest[..end])?;
            self.end_line(events)?;
            if rest[end] == b'\r' {
                match rest.get(end + 1) {
                    Some(b'\n') => rest = &rest[end + 2..],
                    Some(_) => rest = &rest[end + 1..],
                    None => {
                        self.after_cr = true;
                        rest = &[];
                    }
                }
            } else {
                rest = &rest[end + 1..];
            }
        }
        self.extend(rest)
    }

    /// The stream ended: the data of an event that had no blank line after it, if any. The
    /// spec drops such an event; a stream that ends `data: [DONE]` without one is common
    /// enough to keep it.
    pub(crate) fn finish(&mut self) -> Result<Option<String>, SseError> {
        let mut events = Vec::new();
        if !self.line.is_empty() {
            self.end_line(&mut events)?;
        }
        self.end_line(&mut events)?;
        Ok(events.pop())
    }

    fn extend(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        if self.line.len() + bytes.len() > MAX_LINE {
            return Err(SseError::LineTooLong);
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn end_line(&mut self, events: &mut Vec<String>) -> Result<(), SseError> {
        if self.line.is_empty() {
            if self.has_data {
                let mut data = std::mem::take(&mut self.data);
                data.pop(); // the `\n` after the last line
                events.push(data);
                self.has_data = false;
            }
            return Ok(());
        }
        let line = std::str::from_utf8(&self.line).map_err(|_| SseError::Utf8)?;
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        // A comment has an empty field name; `event`, `id` and `retry` mean nothing here.
        if field == "data" {
            self.data.push_str(value);
            self.data.push('\n');
            self.has_data = true;
        }
        self.line.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(chunks: &[&[u8]]) -> Result<Vec<String>, SseError> {
        let mut parser = SseParser::new();
        let mut events = Vec::new();
        for chunk in chunks {
            parser.push(chunk, &mut events)?;
        }
        events.extend(parser.finish()?);
        Ok(events)
    }

    #[test]
    fn events_are_split_on_blank_lines() -> Result<(), SseError> {
        let events = parse(&[b"data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n"])?;
        assert_eq!(events, ["{\"a\":1}", "{\"b\":2}", "[DONE]"]);
        Ok(())
    }

    #[test]
    fn every_line_end_and_every_split_point_gives_the_same_events() -> Result<(), SseError> {
        let expected = ["one", "two\nlines", "", "three"];
        for ending in ["\n", "\r\n", "\r"] {
            let stream = [
                ": keep-alive",
                "data: one",
                "",
                "event: message",
                "data: two",
                "data:lines",
                "id: 7",
                "",
                "data",
                "",
                "data: three",
                "",
                "",
            ]
            .join(ending);
            let bytes = stream.as_bytes();
            for split in 0..=bytes.len() {
                let (head, tail) = bytes.split_at(split);
                assert_eq!(
                    parse(&[head, tail])?,
                    expected,
                    "{ending:?} split at {split}"
                );
            }
            let one_by_one: Vec<&[u8]> = bytes.chunks(1).collect();
            assert_eq!(parse(&one_by_one)?, expected, "{ending:?} byte by byte");
        }
        Ok(())
    }

    #[test]
    fn a_last_event_without_a_blank_line_is_kept() -> Result<(), SseError> {
        assert_eq!(parse(&[b"data: a\n\ndata: [DONE]"])?, ["a", "[DONE]"]);
        assert_eq!(parse(&[b"data: a\n\ndata: [DONE]\n"])?, ["a", "[DONE]"]);
        Ok(())
    }

    #[test]
    fn a_character_split_across_chunks_survives_and_bad_utf8_is_refused() -> Result<(), SseError> {
        let text = "data: héllo\n\n".as_bytes();
        let cut = text
            .iter()
            .position(|&b| b >= 0x80)
            .expect("a multibyte char")
            + 1;
        assert_eq!(parse(&[&text[..cut], &text[cut..]])?, ["héllo"]);
        assert_eq!(parse(&[b"data: \xff\n\n"]), Err(SseError::Utf8));
        Ok(())
    }
}
