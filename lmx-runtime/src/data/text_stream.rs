//! Streaming token ids out as text while a character may be split across tokens.

use super::error::DataError;
use super::tokenizer::Tokenizer;

/// Turns ids into text one id at a time, as a generator samples them, losing nothing.
///
/// A byte-level tokenizer may split a character across ids, so the text of the ids seen so far
/// can end in an incomplete character, which decodes to U+FFFD until its last byte arrives. The
/// stream holds back only such a trailing U+FFFD: as soon as the next id shows that the bytes do
/// not complete a character (the U+FFFD stays and more text follows it), or at
/// [`finish`](Self::finish), undecodable bytes come out as U+FFFD instead of being dropped. An id
/// outside the tokenizer's vocabulary (a model's vocabulary padded past the tokenizer's) has no
/// text and comes out as one U+FFFD.
///
/// The text of the ids is decoded with the previous id as context, so that a tokenizer that
/// drops a word's leading space at the start of a text (SentencePiece) keeps it between words.
/// This assumes what holds for byte-level and SentencePiece tokenizers: the text of more ids
/// starts with the text of fewer.
pub struct TextStream<'a> {
    tokenizer: &'a dyn Tokenizer,
    /// The context id (if any), then the ids whose text is not all handed out yet.
    ids: Vec<u32>,
    /// Bytes of the text of `ids` already handed out (the context's text included).
    emitted: usize,
}

impl<'a> TextStream<'a> {
    /// A stream that decodes with `tokenizer`.
    pub fn new(tokenizer: &'a dyn Tokenizer) -> Self {
        Self {
            tokenizer,
            ids: Vec::new(),
            emitted: 0,
        }
    }

    /// Adds `id`; returns the text that is now certain (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, DataError> {
        if id as usize >= self.tokenizer.vocab_size() {
            let mut text = self.flush()?;
            text.push(char::REPLACEMENT_CHARACTER);
            return Ok(text);
        }
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids)?;
        let ready = text
            .strip_suffix(char::REPLACEMENT_CHARACTER)
            .unwrap_or(&text);
        let out = self.take(&text, ready.len());
        if ready.len() == text.len() {
            // Everything is out: the last id becomes the context of the next.
            self.ids.drain(..self.ids.len() - 1);
            self.emitted = self.tokenizer.decode(&self.ids)?.len();
        }
        Ok(out)
    }

    /// The text held back, undecodable bytes as U+FFFD; the stream starts afresh after it.
    pub fn flush(&mut self) -> Result<String, DataError> {
        let text = self.tokenizer.decode(&self.ids)?;
        let out = self.take(&text, text.len());
        self.ids.clear();
        self.emitted = 0;
        Ok(out)
    }

    /// `text[emitted..end]`, and marks it handed out. Where the text of the ids does not start
    /// with what was handed out (a tokenizer the type's assumption does not hold for), it starts
    /// at the nearest character boundary.
    fn take(&mut self, text: &str, end: usize) -> String {
        let mut start = self.emitted.min(end);
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        self.emitted = self.emitted.max(end);
        text[start..end].to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::ByteTokenizer;

    /// The text a stream hands out for `bytes`, piece by piece, the flush last.
    fn stream(bytes: &[u8]) -> Vec<String> {
        let tokenizer = ByteTokenizer::with_eos();
        let mut stream = TextStream::new(&tokenizer);
        let mut pieces: Vec<String> = bytes
            .iter()
            .map(|&byte| stream.push(u32::from(byte)).unwrap())
            .collect();
        pieces.push(stream.flush().unwrap());
        pieces
    }

    #[test]
    fn a_character_split_across_ids_comes_out_whole_once_complete() {
        // "é" is C3 A9; "€" is E2 82 AC.
        assert_eq!(
            stream(&[b'a', 0xC3, 0xA9, 0xE2, 0x82, 0xAC, b'b']),
            ["a", "", "é", "", "", "€", "b", ""]
        );
    }

    #[test]
    fn bytes_that_cannot_become_a_character_come_out_as_replacement_characters() {
        // A lone continuation byte, a truncated character followed by ASCII, and a truncated
        // character at the end: each is a U+FFFD as soon as a later byte rules it out.
        assert_eq!(
            stream(&[0x80, b'x', 0xE2, 0x82, b'y', 0xF0, 0x9F]),
            ["", "\u{FFFD}x", "", "", "\u{FFFD}y", "", "", "\u{FFFD}"]
        );
        // Invalid bytes one after another: each comes out when the next arrives.
        assert_eq!(
            stream(&[0xFF, 0xFE, 0x80]),
            ["", "\u{FFFD}", "\u{FFFD}", "\u{FFFD}"]
        );
    }

    #[test]
    fn nothing_is_lost_whatever_the_bytes() {
        let bytes: Vec<u8> = (0..2000u32).map(|i| (i * 7919 % 251) as u8).collect();
        assert_eq!(
            stream(&bytes).concat(),
            String::from_utf8_lossy(&bytes),
            "the stream's text is the lossy text of all the bytes"
        );
    }

    #[test]
    fn an_id_outside_the_tokenizer_is_one_replacement_character() {
        let tokenizer = ByteTokenizer::new();
        let mut stream = TextStream::new(&tokenizer);
        assert_eq!(stream.push(u32::from(b'a')).unwrap(), "a");
        assert_eq!(stream.push(0xC3).unwrap(), "");
        assert_eq!(stream.push(300).unwrap(), "\u{FFFD}\u{FFFD}");
        assert_eq!(stream.push(u32::from(b'b')).unwrap(), "b");
    }
}
