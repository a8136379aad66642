//! Strings from outside, as they go into a log: escaped, and cut short.
//!
//! A tool call id, a tool or agent name, an error message from a client, a model or another
//! server comes from whoever sent it. Written into a log raw, a newline in it forges a record
//! of its own, an escape code rewrites the operator's terminal, and a megabyte of it writes a
//! megabyte of log (twice, when it is logged twice).

use std::fmt::{self, Write as _};

/// The most bytes an [`Untrusted`] value writes to a log, before the marker that says how
/// much of it was cut.
pub const UNTRUSTED_LOG_BYTES: usize = 256;

/// A value from outside, for a log record: written on one line, its control characters
/// (newlines, escape codes), Unicode's bidirectional controls and backslashes escaped (`\n`,
/// `\u{1b}`, `\\`), and cut after [`UNTRUSTED_LOG_BYTES`] with a marker that says how many of
/// its bytes were left out. Escaping and cutting happen as it is written: nothing is copied.
///
/// ```
/// use dormant::types::Untrusted;
///
/// let id = "call-1\n2026-01-01 INFO forged\u{1b}[2J";
/// assert_eq!(
///     Untrusted(id).to_string(),
///     r"call-1\n2026-01-01 INFO forged\u{1b}[2J"
/// );
/// let long = "x".repeat(1_000_000);
/// assert_eq!(
///     Untrusted(&long).to_string(),
///     format!("{}…[+999744 bytes]", "x".repeat(256))
/// );
/// tracing::warn!(tool_call_id = %Untrusted(id), "an answer for no call");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Untrusted<T>(pub T);

impl<T: fmt::Display> fmt::Display for Untrusted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = Escaped {
            out: f,
            written: 0,
            cut: 0,
        };
        write!(out, "{}", self.0)?;
        let cut = out.cut;
        if cut > 0 {
            write!(f, "…[+{cut} bytes]")?;
        }
        Ok(())
    }
}

/// Writes what it is given escaped, up to the bound, and counts the bytes past it.
struct Escaped<'a, 'b> {
    out: &'a mut fmt::Formatter<'b>,
    written: usize,
    cut: usize,
}

impl fmt::Write for Escaped<'_, '_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        if self.cut > 0 {
            self.cut += text.len();
            return Ok(());
        }
        for (at, character) in text.char_indices() {
            let plain = !character.is_control() && !bidirectional(character) && character != '\\';
            let width = match character {
                _ if plain => character.len_utf8(),
                '\\' | '\n' | '\r' | '\t' => 2,
                _ => character.escape_unicode().len(),
            };
            if self.written + width > UNTRUSTED_LOG_BYTES {
                self.cut = text.len() - at;
                return Ok(());
            }
            self.written += width;
            match character {
                _ if plain => self.out.write_char(character)?,
                '\\' => self.out.write_str(r"\\")?,
                '\n' => self.out.write_str(r"\n")?,
                '\r' => self.out.write_str(r"\r")?,
                '\t' => self.out.write_str(r"\t")?,
                _ => write!(self.out, "{}", character.escape_unicode())?,
            }
        }
        Ok(())
    }
}

/// Unicode's bidirectional controls, which reorder what a terminal shows (CVE-2021-42574).
fn bidirectional(character: char) -> bool {
    matches!(
        character,
        '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_backslashes_are_escaped_and_the_rest_is_kept() {
        assert_eq!(
            Untrusted("a\r\n\t\\b\u{7f}\u{202e}é✓").to_string(),
            r"a\r\n\t\\b\u{7f}\u{202e}é✓"
        );
    }

    #[test]
    fn a_long_value_is_cut_at_the_bound_on_a_character_boundary_with_what_was_cut() {
        let text = format!("{}é{}", "a".repeat(UNTRUSTED_LOG_BYTES - 1), "b".repeat(10));
        let shown = Untrusted(&text).to_string();
        assert_eq!(
            shown,
            format!("{}…[+12 bytes]", "a".repeat(UNTRUSTED_LOG_BYTES - 1))
        );
        // An escape is never split either: the bound counts what is written.
        let newlines = "\n".repeat(UNTRUSTED_LOG_BYTES);
        let shown = Untrusted(&newlines).to_string();
        assert_eq!(
            shown,
            format!(
                "{}…[+{} bytes]",
                r"\n".repeat(UNTRUSTED_LOG_BYTES / 2),
                UNTRUSTED_LOG_BYTES / 2
            )
        );
    }

    #[test]
    fn a_value_written_in_pieces_is_bounded_as_a_whole() {
        struct Pieces;
        impl fmt::Display for Pieces {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                for _ in 0..100 {
                    f.write_str("0123456789")?;
                }
                Ok(())
            }
        }
        assert_eq!(
            Untrusted(Pieces).to_string(),
            format!(
                "{}012345…[+744 bytes]",
                "0123456789".repeat(UNTRUSTED_LOG_BYTES / 10)
            )
        );
    }
}
