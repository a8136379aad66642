//! Line ranges, so that the model can read a long reference file in parts.

use serde::{Deserialize, Serialize};

use super::Error;

/// Which lines of a resource to read: 1-based and inclusive. `start_line` defaults to the
/// first line and `end_line` to the last; an end past the file is clamped to it.
///
/// ```
/// use dormant::skills::ReadRange;
///
/// let range = ReadRange::lines(2, 3);
/// assert_eq!(range.apply("a\nb\nc\nd\n").as_deref(), Ok("b\nc"));
/// assert_eq!(ReadRange::from_line(3).apply("a\nb\nc\nd").as_deref(), Ok("c\nd"));
/// assert!(ReadRange::lines(3, 2).apply("a\nb\nc").is_err());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReadRange {
    /// The first line to read, from 1; `None` for the first line of the file.
    pub start_line: Option<usize>,
    /// The last line to read, inclusive; `None` for the last line of the file.
    pub end_line: Option<usize>,
}

impl ReadRange {
    /// Lines `start` to `end`, both included.
    pub fn lines(start: usize, end: usize) -> Self {
        Self {
            start_line: Some(start),
            end_line: Some(end),
        }
    }

    /// From line `start` to the end of the file.
    pub fn from_line(start: usize) -> Self {
        Self {
            start_line: Some(start),
            end_line: None,
        }
    }

    /// The selected lines of `text` (split as [`str::lines`] does), joined by `\n`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidRange`] when the start is 0, after the end, or past the last line.
    pub fn apply(&self, text: &str) -> Result<String, Error> {
        let invalid = |reason: String| Err(Error::InvalidRange { reason });
        let start = self.start_line.unwrap_or(1);
        if start == 0 {
            return invalid("start_line is 0; lines are numbered from 1".to_owned());
        }
        if let Some(end) = self.end_line {
            if start > end {
                return invalid(format!("start_line {start} is after end_line {end}"));
            }
        }
        let count = text.lines().count();
        if start > count {
            return invalid(format!(
                "start_line {start} is past the end of the file, which has {count} lines"
            ));
        }
        let end = self.end_line.map_or(count, |end| end.min(count));
        let selected: Vec<&str> = text.lines().skip(start - 1).take(end + 1 - start).collect();
        Ok(selected.join("\n"))
    }
}

/// The text a read returns: the whole file unchanged without a range, else its lines.
pub(crate) fn select(text: String, range: Option<ReadRange>) -> Result<String, Error> {
    match range {
        None => Ok(text),
        Some(range) => range.apply(&text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "one\ntwo\nthree\nfour\n";

    fn read(start: Option<usize>, end: Option<usize>) -> Result<String, Error> {
        ReadRange {
            start_line: start,
            end_line: end,
        }
        .apply(TEXT)
    }

    #[test]
    fn no_range_returns_the_text_unchanged() {
        assert_eq!(select(TEXT.to_owned(), None).as_deref(), Ok(TEXT));
    }

    #[test]
    fn defaults_cover_the_whole_file() {
        assert_eq!(read(None, None).as_deref(), Ok("one\ntwo\nthree\nfour"));
        assert_eq!(read(Some(3), None).as_deref(), Ok("three\nfour"));
        assert_eq!(read(None, Some(2)).as_deref(), Ok("one\ntwo"));
    }

    #[test]
    fn bounds_are_inclusive() {
        assert_eq!(read(Some(2), Some(3)).as_deref(), Ok("two\nthree"));
        assert_eq!(read(Some(4), Some(4)).as_deref(), Ok("four"));
    }

    #[test]
    fn an_end_past_the_file_is_clamped() {
        assert_eq!(read(Some(3), Some(99)).as_deref(), Ok("three\nfour"));
    }

    #[test]
    fn a_start_of_zero_after_the_end_or_past_the_file_is_refused() {
        for (start, end) in [
            (Some(0), None),
            (Some(3), Some(2)),
            (Some(5), None),
            (None, Some(0)),
        ] {
            let error = read(start, end).expect_err("invalid range");
            assert_eq!(error.code(), "invalid_range", "{start:?}..{end:?}");
        }
    }

    #[test]
    fn crlf_line_endings_are_lines_too() {
        let range = ReadRange::lines(2, 2);
        assert_eq!(range.apply("a\r\nb\r\nc").as_deref(), Ok("b"));
    }
}
