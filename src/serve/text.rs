//! A sequence's tokens as text, piece by piece, ending at a stop string: the runtime's
//! incremental detokenizer (complete UTF-8 only), and text held back while it could still be
//! the start of a stop string.

use lmx::runtime::data::{self, DataError, Tokenizer};

/// The text of generated tokens, up to the first stop string.
pub struct TextStream<'a> {
    tokens: data::TextStream<'a>,
    stops: Vec<String>,
    /// Decoded text not yet handed out: it could be the start of a stop string.
    held: String,
    stopped: bool,
}

impl<'a> TextStream<'a> {
    /// A stream decoding with `tokenizer` that ends before the first of `stops` (none empty).
    pub fn new(tokenizer: &'a dyn Tokenizer, stops: Vec<String>) -> Self {
        TextStream {
            tokens: data::TextStream::new(tokenizer),
            stops,
            held: String::new(),
            stopped: false,
        }
    }

    /// Adds a token; returns the text that is now certain, if any. After a stop string nothing
    /// more comes.
    pub fn push(&mut self, token: u32) -> Result<Option<String>, DataError> {
        if self.stopped {
            return Ok(None);
        }
        let piece = self.tokens.push(token)?;
        self.held.push_str(&piece);
        Ok(self.release(false))
    }

    /// The text still held back, up to a stop string.
    pub fn finish(&mut self) -> Result<String, DataError> {
        if self.stopped {
            return Ok(String::new());
        }
        let piece = self.tokens.flush()?;
        self.held.push_str(&piece);
        Ok(self.release(true).unwrap_or_default())
    }

    /// Whether a stop string has ended the text.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Hands out the held text up to a stop string (and stops), or all but its longest end that
    /// starts a stop string (all of it when `last`).
    fn release(&mut self, last: bool) -> Option<String> {
        let earliest = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()))
            .min();
        let end = match earliest {
            Some(at) => {
                self.stopped = true;
                at
            }
            None if last => self.held.len(),
            None => self.held.len() - self.open_stop_len(),
        };
        let out: String = self.held.drain(..end).collect();
        if self.stopped {
            self.held.clear();
        }
        (!out.is_empty()).then_some(out)
    }

    /// The length of the longest end of the held text that a stop string starts with.
    fn open_stop_len(&self) -> usize {
        let held = &self.held;
        (1..=held.len())
            .rev()
            .filter(|&len| held.is_char_boundary(held.len() - len))
            .find(|&len| {
                let end = &held[held.len() - len..];
                self.stops
                    .iter()
                    .any(|stop| stop.len() > len && stop.starts_with(end))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::TextStream;
    use lmx::runtime::data::ByteTokenizer;

    /// Pushes `text`'s bytes one at a time; returns the pieces handed out and the rest.
    fn run(text: &str, stops: &[&str]) -> (Vec<String>, String, bool) {
        let tokenizer = ByteTokenizer::new();
        let mut stream = TextStream::new(&tokenizer, stops.iter().map(|s| s.to_string()).collect());
        let mut pieces = Vec::new();
        for byte in text.bytes() {
            if let Some(piece) = stream.push(byte as u32).unwrap() {
                pieces.push(piece);
            }
        }
        let rest = stream.finish().unwrap();
        (pieces, rest, stream.stopped())
    }

    #[test]
    fn text_ends_before_the_first_stop_string_and_nothing_of_it_leaks() {
        let (pieces, rest, stopped) = run("ab<|endX|>cd<|end|>ef", &["<|end|>"]);
        // What was handed out cannot be taken back: no start of the stop string came out.
        assert_eq!(pieces.concat() + &rest, "ab<|endX|>cd");
        assert!(stopped);
    }

    #[test]
    fn a_possible_stop_is_held_back_and_released_when_it_turns_out_not_to_be() {
        let tokenizer = ByteTokenizer::new();
        let mut stream = TextStream::new(&tokenizer, vec!["xyz".into()]);
        assert_eq!(stream.push(b'a' as u32).unwrap().as_deref(), Some("a"));
        assert_eq!(stream.push(b'x' as u32).unwrap(), None);
        assert_eq!(stream.push(b'y' as u32).unwrap(), None);
        assert_eq!(stream.push(b'q' as u32).unwrap().as_deref(), Some("xyq"));
        assert_eq!(stream.push(b'x' as u32).unwrap(), None);
        assert_eq!(stream.finish().unwrap(), "x");
        assert!(!stream.stopped());
    }

    #[test]
    fn multibyte_characters_come_out_whole_and_the_earliest_of_several_stops_wins() {
        let (pieces, rest, stopped) = run("né→ok END then STOP", &["STOP", "END"]);
        assert_eq!(pieces.concat() + &rest, "né→ok ");
        assert!(stopped);
        assert!(pieces.iter().all(|piece| !piece.contains('\u{FFFD}')));
    }
}
