//! Finding any of millions of source values inside text, fast to build and
//! linear to search. Each value (folded to lower case) is filed under its
//! rarest word (a run of letters and digits), with where that word sits in
//! it; a text is read word by word, and each word that files values is
//! checked at the offsets it was filed with against the set of values. So a
//! value is found whole or inside a text wherever it starts and ends at word
//! edges, or anywhere its rarest word does (`mailto:jane@corp.io`, `(jane@corp.io).`);
//! one glued inside a longer word (`xjane@corp.io`) is not.

use std::collections::{HashMap, HashSet};

/// The source values looked for.
pub struct Needles {
    values: HashSet<String>,
    /// Word -> (byte offset of the word in the value, the value's length in bytes).
    filed: HashMap<String, Vec<(u32, u32)>>,
}

/// Each word of `text` with its byte offset.
fn words(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_alphanumeric(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, &text[s..i]));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, &text[s..]));
    }
    out.into_iter()
}

impl Needles {
    /// Files `values` (any case).
    pub fn new(values: impl IntoIterator<Item = String>) -> Needles {
        let values: HashSet<String> = values.into_iter().map(|v| v.to_lowercase()).collect();
        let mut counts: HashMap<&str, u32> = HashMap::new();
        for v in &values {
            for (_, w) in words(v) {
                *counts.entry(w).or_default() += 1;
            }
        }
        let mut filed: HashMap<String, Vec<(u32, u32)>> = HashMap::new();
        for v in &values {
            let rarest = words(v)
                .min_by_key(|(_, w)| (counts.get(w).copied().unwrap_or(0), std::cmp::Reverse(w.len())));
            if let Some((at, w)) = rarest {
                let shapes = filed.entry(w.to_owned()).or_default();
                let shape = (at as u32, v.len() as u32);
                if !shapes.contains(&shape) {
                    shapes.push(shape);
                }
            }
        }
        Needles { values, filed }
    }

    /// How many values are looked for.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Whether `text` holds one of the values, whatever its case, or once its
    /// `%XX` escapes are read.
    pub fn found_in(&self, text: &str) -> bool {
        let lower;
        let text = match text.chars().any(char::is_uppercase) {
            true => {
                lower = text.to_lowercase();
                lower.as_str()
            }
            false => text,
        };
        self.in_folded(text) || (text.contains('%') && self.in_folded(&percent_decoded(text)))
    }

    fn in_folded(&self, text: &str) -> bool {
        if self.values.contains(text) {
            return true;
        }
        for (at, w) in words(text) {
            let Some(shapes) = self.filed.get(w) else { continue };
            for (offset, len) in shapes {
                let Some(start) = at.checked_sub(*offset as usize) else { continue };
                if let Some(candidate) = text.get(start..start + *len as usize) {
                    if self.values.contains(candidate) {
                        return true;
                    }
                }
            }
        }
        false
    }
}

/// `%40` read as `@` (what a URL's query makes of an email address).
fn percent_decoded(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).and_then(|b| hex(*b)), bytes.get(i + 2).and_then(|b| hex(*b))) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_found_whole_inside_and_whatever_their_case_or_escapes() {
        let n = Needles::new(
            ["Zoë Müller", "alice.cooper@example.org", "+44 20 7946001", "5551234567", "user7@mail.example"]
                .iter()
                .map(|s| s.to_string()),
        );
        assert!(n.found_in("customer ZOË MÜLLER called"));
        assert!(n.found_in("see /reset?email=alice.cooper%40example.org&x=1"));
        assert!(n.found_in("ALICE.COOPER@EXAMPLE.ORG"));
        assert!(n.found_in("call (+44 20 7946001)."));
        assert!(n.found_in("5551234567"));
        assert!(n.found_in("{\"e\": \"user7@mail.example\"}"));
        assert!(!n.found_in("user77@mail.example"), "another value");
        assert!(!n.found_in("nothing here"));
        assert_eq!(percent_decoded("a%2"), "a%2");
    }

    #[test]
    fn a_million_values_are_filed_quickly() {
        let began = std::time::Instant::now();
        let n = Needles::new((0..1_000_000).map(|i| format!("user{i}@mail{}.example-corp.com", i % 97)));
        assert_eq!(n.len(), 1_000_000);
        assert!(n.found_in("write to USER424242@mail61.example-corp.com today"));
        assert!(!n.found_in("write to user424242@mail62.example-corp.com today"));
        // Generous: a debug build on a busy machine.
        assert!(began.elapsed() < std::time::Duration::from_secs(60));
    }
}
