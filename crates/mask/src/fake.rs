//! Fakes that keep a value's format, drawn from a digest of it. Their
//! domains are reserved or plainly invented: emails at `example.com`/`.net`/
//! `.org` (RFC 2606), IPv4 addresses in 10.0.0.0/8, IPv6 in fd00::/8, so a
//! masked value never reaches a real person.

use crate::key::Draw;

const FIRST: &[&str] = &[
    "Ada", "Alba", "Amos", "Anika", "Arlo", "Bea", "Bram", "Cleo", "Dara", "Edda", "Elio", "Enzo", "Fern",
    "Ines", "Ivo", "Jonas", "Juna", "Kai", "Kira", "Lene", "Lior", "Luz", "Mads", "Mila", "Nico", "Noor",
    "Odile", "Olan", "Pim", "Quill", "Rafa", "Remy", "Runa", "Sami", "Sela", "Taavi", "Tove", "Ugo", "Vida",
    "Wren", "Xavi", "Yara", "Yuki", "Zane", "Zita", "Oren", "Maren", "Teo",
];
const LAST: &[&str] = &[
    "Abernat",
    "Brightwater",
    "Calloway",
    "Dunmore",
    "Eastwick",
    "Fairholm",
    "Glenrow",
    "Hallowell",
    "Ivers",
    "Juniper",
    "Kestrel",
    "Larkspur",
    "Merriweather",
    "Northcott",
    "Oakhurst",
    "Pembry",
    "Quarrington",
    "Redfern",
    "Stillwell",
    "Thornbury",
    "Underhill",
    "Vantage",
    "Westmore",
    "Yarrowby",
    "Zellweg",
    "Ashdown",
    "Birchmoor",
    "Coldharbour",
    "Draycott",
    "Elmstead",
    "Foxley",
    "Greyholt",
];
const STREETS: &[&str] = &[
    "Alder", "Beacon", "Cedar", "Dovecote", "Elm", "Foundry", "Garnet", "Harbor", "Ivy", "Juniper", "Kiln",
    "Linden", "Millrace", "Nettle", "Orchard", "Pillar", "Quarry", "Rowan", "Saffron", "Tannery", "Upland",
    "Vale", "Willow", "Yew",
];
const SUFFIXES: &[&str] = &["Street", "Road", "Lane", "Avenue", "Way", "Close", "Row", "Court"];
const CITIES: &[&str] = &[
    "Ashbury",
    "Brookhaven",
    "Carrow",
    "Dunwick",
    "Elderford",
    "Fallowmere",
    "Greystone",
    "Highcombe",
    "Ironbridge",
    "Kingsmere",
    "Lowmoor",
    "Marshfield",
    "Newhaven",
    "Oakridge",
    "Pinecrest",
    "Riverton",
];
const DOMAINS: &[&str] = &["example.com", "example.net", "example.org"];

/// `word.word.hex@example.xx`: the local part from the name lists and 12 hex
/// digits (48 bits, so collisions are rare and drawn again when they happen).
pub(crate) fn email(d: &mut Draw, source: &str) -> String {
    let local = format!("{}.{}.{}", d.pick(FIRST), d.pick(LAST), d.hex(12)).to_lowercase();
    let domain = d.pick(DOMAINS);
    let out = format!("{local}@{domain}");
    if source.chars().any(|c| c.is_ascii_uppercase()) && !source.chars().any(|c| c.is_ascii_lowercase()) {
        out.to_uppercase()
    } else {
        out
    }
}

/// As many words as the source has, capitalised as it is.
pub(crate) fn name(d: &mut Draw, source: &str) -> String {
    let words: Vec<&str> = source.split_whitespace().collect();
    let n = words.len().max(1);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let word = if i + 1 == n && n > 1 { d.pick(LAST) } else { d.pick(FIRST) };
        let cased = match words.get(i) {
            Some(w) if w.chars().all(|c| !c.is_alphabetic() || c.is_uppercase()) && w.len() > 1 => {
                word.to_uppercase()
            }
            Some(w) if w.chars().all(|c| !c.is_alphabetic() || c.is_lowercase()) => word.to_lowercase(),
            _ => word.to_owned(),
        };
        out.push(cased);
    }
    out.join(" ")
}

/// Every digit drawn again, punctuation kept; a leading `+` keeps the digit
/// after it (the country code's first) so the number reads as the same
/// country's. Letters (an extension's name, an email address where a phone
/// number should be) are drawn again too, so nothing of the source is kept.
pub(crate) fn phone(d: &mut Draw, source: &str) -> String {
    let keep_first = source.trim_start().starts_with('+');
    let mut seen_digit = false;
    source
        .chars()
        .map(|c| {
            if c.is_alphabetic() {
                let letter = char::from(b'a' + d.below(26) as u8);
                return if c.is_uppercase() { letter.to_ascii_uppercase() } else { letter };
            }
            // Digits of any script (`٠٥٥`) are drawn again, as ASCII digits.
            if !c.is_numeric() {
                return c;
            }
            let first = !seen_digit;
            seen_digit = true;
            if first && keep_first {
                c
            } else {
                char::from(b'0' + d.below(10) as u8)
            }
        })
        .collect()
}

/// `NUMBER Street Suffix`, and `, City` when the source has a comma.
pub(crate) fn address(d: &mut Draw, source: &str) -> String {
    let mut out = format!("{} {} {}", 1 + d.below(9999), d.pick(STREETS), d.pick(SUFFIXES));
    if source.contains(',') {
        out.push_str(", ");
        out.push_str(d.pick(CITIES));
    }
    out
}

/// An IPv4 address in 10.0.0.0/8 or an IPv6 one in fd00::/8, with the
/// source's prefix length if it had one.
pub(crate) fn ip(d: &mut Draw, source: &str) -> String {
    let (addr, prefix) = match source.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (source, None),
    };
    let mut out = if addr.contains(':') {
        let groups: Vec<String> = (0..7).map(|_| format!("{:x}", d.below(0x10000))).collect();
        format!("fd{:02x}:{}", d.below(256), groups.join(":"))
    } else {
        format!("10.{}.{}.{}", d.below(256), d.below(256), 1 + d.below(254))
    };
    if let Some(p) = prefix {
        out.push('/');
        out.push_str(p);
    }
    out
}

/// A version-4-shaped UUID, in the source's case.
pub(crate) fn uuid(d: &mut Draw, source: &str) -> String {
    let h = d.hex(32);
    let variant = ["8", "9", "a", "b"][d.below(4) as usize];
    let out = format!("{}-{}-4{}-{}{}-{}", &h[0..8], &h[8..12], &h[13..16], variant, &h[17..20], &h[20..32]);
    if source.chars().any(|c| c.is_ascii_uppercase()) {
        out.to_uppercase()
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(n: u8) -> Draw {
        Draw::new([n; 32])
    }

    #[test]
    fn fakes_keep_the_format() {
        let e = email(&mut draw(1), "Jane.Doe@corp.io");
        assert!(e.contains('@') && DOMAINS.iter().any(|d| e.ends_with(d)), "{e}");
        assert_eq!(name(&mut draw(2), "jane doe").split(' ').count(), 2);
        assert!(name(&mut draw(2), "jane doe").chars().all(|c| !c.is_uppercase()));
        let p = phone(&mut draw(3), "+44 (20) 7946-0958");
        assert_eq!(p.len(), "+44 (20) 7946-0958".len());
        assert!(p.starts_with("+4") && p.contains(" (") && p.contains('-'), "{p}");
        assert!(!phone(&mut draw(3), "٠٥٥١٢٣٤٥٦٧").contains('٥'));
        let not_a_phone = phone(&mut draw(3), "buyer7@supplier.co.uk");
        assert!(!not_a_phone.contains("buyer") && !not_a_phone.contains("supplier"), "{not_a_phone}");
        assert!(address(&mut draw(4), "1 High St, Leeds").contains(", "));
        assert!(ip(&mut draw(5), "192.168.1.7").parse::<std::net::Ipv4Addr>().is_ok());
        assert!(ip(&mut draw(5), "2001:db8::1").parse::<std::net::Ipv6Addr>().is_ok());
        assert_eq!(ip(&mut draw(5), "192.168.1.0/24").split('/').nth(1), Some("24"));
        let u = uuid(&mut draw(6), "6f1c2a3b-0000-4000-8000-000000000000");
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
    }
}
