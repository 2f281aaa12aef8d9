//! Streaming token ids out as text while a character may be split across tokens, and stopping
//! at stop strings.

use crate::data::Tokenizer;
use std::sync::Arc;

/// Turns ids into text one id at a time, as a generator samples them, losing nothing, and ends
/// the text before the first stop string.
///
/// A byte-level tokenizer may split a character across ids, so the text of the ids seen so far
/// can end in an incomplete character, which decodes to U+FFFD until its last byte arrives. The
/// stream holds back only such a trailing U+FFFD: as soon as the next id shows that the bytes do
/// not complete a character (the U+FFFD stays and more text follows it), or at
/// [`finish`](Self::finish), undecodable bytes come out as U+FFFD instead of being dropped. An id
/// the tokenizer cannot decode (one outside its vocabulary: a model's vocabulary padded past the
/// tokenizer's) has no text and comes out as one U+FFFD.
///
/// Text that could still be the start of a stop string is held back too, until the next ids
/// show that it is not. At a stop string the text ends (the stop string left out), and
/// [`stopped`](Self::stopped) says so: the generator should stop.
///
/// The text of the ids is decoded with the previous id as context, so that a tokenizer that
/// drops a word's leading space at the start of a text (SentencePiece) keeps it between words.
/// This assumes what holds for byte-level and SentencePiece tokenizers: the text of more ids
/// starts with the text of fewer.
pub struct TextStream {
    tokenizer: Arc<dyn Tokenizer>,
    /// The context id (if any), then the ids whose text is not all decoded yet.
    ids: Vec<u32>,
    /// Bytes of the text of `ids` already decoded (the context's text included).
    emitted: usize,
    /// The strings that end the text (none empty).
    stop: Vec<String>,
    /// Decoded text held back because it may begin a stop string.
    held: String,
    /// Whether a stop string was met.
    stopped: bool,
}

impl TextStream {
    /// A stream that decodes with `tokenizer` and ends at the first of `stop` (empty strings
    /// are ignored).
    pub fn new(tokenizer: Arc<dyn Tokenizer>, stop: Vec<String>) -> Self {
        Self {
            tokenizer,
            ids: Vec::new(),
            emitted: 0,
            stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Adds `id`; returns the text that is now certain, `None` when there is none (nothing more
    /// after a stop string).
    pub fn push(&mut self, id: u32) -> Option<String> {
        if self.stopped {
            return None;
        }
        let text = self.decode_next(id);
        self.held.push_str(&text);
        let out = self.release(false);
        (!out.is_empty()).then_some(out)
    }

    /// Whether the text met a stop string: it is complete.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The text held back (undecodable bytes as U+FFFD, text that began a stop string but
    /// ended first); the stream starts afresh after it.
    pub fn finish(&mut self) -> String {
        if !self.stopped {
            let rest = self.flush_ids();
            self.held.push_str(&rest);
        }
        let out = self.release(true);
        self.ids.clear();
        self.emitted = 0;
        self.stopped = false;
        out
    }

    /// The text of `held` that no stop string can claim any more, taken out of it: up to the
    /// first stop string (ending the text), else all but the longest tail that begins one
    /// (all of it at the `end`).
    fn release(&mut self, end: bool) -> String {
        let first_stop = self
            .stop
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()))
            .min();
        if let Some(at) = first_stop {
            self.stopped = true;
            let out = self.held[..at].to_owned();
            self.held.clear();
            return out;
        }
        let keep = if end { 0 } else { self.stop_prefix_len() };
        let cut = self.held.len() - keep;
        let rest = self.held.split_off(cut);
        std::mem::replace(&mut self.held, rest)
    }

    /// The length of the longest tail of `held` that is the start of a stop string.
    fn stop_prefix_len(&self) -> usize {
        self.stop
            .iter()
            .flat_map(|stop| {
                (1..stop.len())
                    .rev()
                    .filter(|&k| stop.is_char_boundary(k))
                    .find(|&k| self.held.ends_with(&stop[..k]))
            })
            .max()
            .unwrap_or(0)
    }

    /// The text that `id` completes (possibly empty).
    fn decode_next(&mut self, id: u32) -> String {
        if id as usize >= self.tokenizer.vocab_size() {
            return self.undecodable();
        }
        self.ids.push(id);
        let Ok(text) = self.tokenizer.decode(&self.ids) else {
            self.ids.pop();
            return self.undecodable();
        };
        let ready = text
            .strip_suffix(char::REPLACEMENT_CHARACTER)
            .unwrap_or(&text);
        let out = self.take(&text, ready.len());
        if ready.len() == text.len() {
            // Everything is out: the last id becomes the context of the next.
            self.ids.drain(..self.ids.len() - 1);
            self.emitted = self.tokenizer.decode(&self.ids).map_or(0, |t| t.len());
        }
        out
    }

    /// The text of the ids held, then one U+FFFD for an id without text.
    fn undecodable(&mut self) -> String {
        let mut text = self.flush_ids();
        text.push(char::REPLACEMENT_CHARACTER);
        text
    }

    /// The text of the ids held back, undecodable bytes as U+FFFD; no id is held after it.
    fn flush_ids(&mut self) -> String {
        let text = self.tokenizer.decode(&self.ids).unwrap_or_default();
        let out = self.take(&text, text.len());
        self.ids.clear();
        self.emitted = 0;
        out
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

    /// The text a stream with `stop` hands out for `bytes`, piece by piece ("" for none), the
    /// finish last.
    fn stream_with(tokenizer: ByteTokenizer, stop: &[&str], bytes: &[u8]) -> Vec<String> {
        let stop = stop.iter().map(|s| s.to_string()).collect();
        let mut stream = TextStream::new(Arc::new(tokenizer), stop);
        let mut pieces: Vec<String> = bytes
            .iter()
            .map(|&byte| stream.push(u32::from(byte)).unwrap_or_default())
            .collect();
        pieces.push(stream.finish());
        pieces
    }

    fn stream(bytes: &[u8]) -> Vec<String> {
        stream_with(ByteTokenizer::with_eos(), &[], bytes)
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
        let mut stream = TextStream::new(Arc::new(ByteTokenizer::new()), Vec::new());
        assert_eq!(stream.push(u32::from(b'a')).as_deref(), Some("a"));
        assert_eq!(stream.push(0xC3), None);
        assert_eq!(stream.push(300).as_deref(), Some("\u{FFFD}\u{FFFD}"));
        assert_eq!(stream.push(u32::from(b'b')).as_deref(), Some("b"));
    }

    #[test]
    fn text_ends_before_the_first_stop_string_held_back_while_it_may_begin_one() {
        let tokenizer = ByteTokenizer::with_eos;
        // "ab" may begin "abc": held until 'x' shows it does not; then "abc" ends the text.
        assert_eq!(
            stream_with(tokenizer(), &["abc"], b"xabxabcyz"),
            ["x", "", "", "abx", "", "", "", "", "", ""]
        );
        // The earliest stop string wins, whichever is listed first.
        assert_eq!(
            stream_with(tokenizer(), &["cd", "b"], b"abcd").concat(),
            "a"
        );
        // A stop string split inside a character: "é" is C3 A9, held until complete.
        assert_eq!(
            stream_with(tokenizer(), &["é!"], &[b'a', 0xC3, 0xA9, b'!', b'z']),
            ["a", "", "", "", "", ""]
        );
        // Text that began a stop string but ended first comes out at the finish.
        assert_eq!(
            stream_with(tokenizer(), &["abc"], b"zab"),
            ["z", "", "", "ab"]
        );
    }

    #[test]
    fn a_stream_reports_the_stop_and_hands_out_nothing_after_it() {
        let mut stream = TextStream::new(Arc::new(ByteTokenizer::new()), vec!["\n".into()]);
        assert_eq!(stream.push(u32::from(b'h')).as_deref(), Some("h"));
        assert!(!stream.stopped());
        assert_eq!(stream.push(u32::from(b'\n')), None);
        assert!(stream.stopped());
        assert_eq!(stream.push(u32::from(b'i')), None);
        assert_eq!(stream.finish(), "");
    }
}
