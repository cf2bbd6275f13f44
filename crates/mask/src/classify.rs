//! Which columns hold personal data: by their name, and by what a sample of
//! their values looks like. `airlock golden scan` proposes a rule for each
//! column found, and a masked build refuses a found column without one.

use airlock_core::records::masking::{JsonPathRule, Spec};
use serde_json::Value;

use crate::transform::ColumnType;

/// A kind of personal data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Email addresses.
    Email,
    /// Phone numbers.
    Phone,
    /// People's names.
    PersonName,
    /// Street addresses and postcodes.
    Address,
    /// Payment card numbers (they pass the Luhn check).
    Card,
    /// Bank account numbers (IBANs, which pass their check digits).
    Iban,
    /// National identity numbers (social security numbers and the like).
    NationalId,
    /// IP addresses.
    Ip,
    /// Dates of birth.
    BirthDate,
    /// Free text that quotes emails or phone numbers.
    FreeText,
    /// Where someone is: coordinates.
    Location,
    /// Identifiers of a card, a vehicle or a device (security codes, plates, MAC addresses).
    Identifier,
}

impl Class {
    /// How the report names it.
    pub fn label(self) -> &'static str {
        match self {
            Class::Email => "email",
            Class::Phone => "phone",
            Class::PersonName => "person name",
            Class::Address => "address",
            Class::Card => "card number",
            Class::Iban => "IBAN",
            Class::NationalId => "national id",
            Class::Ip => "IP address",
            Class::BirthDate => "date of birth",
            Class::FreeText => "free text with personal data",
            Class::Location => "location",
            Class::Identifier => "card, vehicle or device identifier",
        }
    }

    /// The rule proposed for a column of this class.
    pub fn proposal(self) -> Spec {
        let named = |t: &str| Spec { transform: t.into(), ..Default::default() };
        match self {
            Class::Email => named("email"),
            Class::Phone => named("phone"),
            Class::PersonName => named("name"),
            Class::Address => named("address"),
            Class::Ip => named("ip"),
            Class::Card | Class::Iban => Spec { keep_last: Some(4), ..named("partial") },
            Class::NationalId | Class::FreeText | Class::Identifier => named("redact"),
            Class::Location => Spec { bound: Some(0.01), ..named("noise") },
            Class::BirthDate => Spec { bound: Some(30.0), ..named("noise") },
        }
    }
}

/// Why a column was classed.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// What it holds.
    pub class: Class,
    /// Why: its name, or the share of sampled values that look so.
    pub reason: String,
    /// For a JSON column: the paths inside it and their classes.
    pub paths: Vec<(String, Class)>,
}

/// Looks at a column's name (and its table's) and type, then at `sample`
/// (its values as text, non-null); `None` when nothing personal shows.
pub fn column(table: &str, name: &str, ty: &ColumnType, sample: &[String]) -> Option<Finding> {
    if *ty == ColumnType::Json {
        let docs: Vec<Value> = sample.iter().filter_map(|s| serde_json::from_str(s).ok()).collect();
        let paths = json_paths(&docs);
        if paths.is_empty() {
            return None;
        }
        let reason = format!(
            "JSON holding {}",
            paths.iter().map(|(p, c)| format!("{} at {p}", c.label())).collect::<Vec<_>>().join(", ")
        );
        return Some(Finding { class: paths[0].1, reason, paths });
    }
    if let Some(class) = by_name(table, name, ty) {
        return Some(Finding { class, reason: format!("its name ({name})"), paths: vec![] });
    }
    if *ty == ColumnType::Inet {
        return Some(Finding { class: Class::Ip, reason: "its type (inet)".into(), paths: vec![] });
    }
    if !matches!(ty, ColumnType::Text { .. }) || sample.is_empty() {
        return None;
    }
    by_content(sample).map(|(class, share)| Finding {
        class,
        reason: format!("{:.0}% of {} sampled values look like {}", share * 100.0, sample.len(), what(class)),
        paths: vec![],
    })
}

fn what(class: Class) -> &'static str {
    match class {
        Class::FreeText => "text quoting an email address or phone number",
        Class::Email => "email addresses",
        Class::Phone => "phone numbers",
        Class::PersonName => "people's names",
        Class::Card => "card numbers (Luhn-valid)",
        Class::Iban => "IBANs (check digits valid)",
        Class::NationalId => "national id numbers",
        Class::Ip => "IP addresses",
        Class::Address => "street addresses",
        Class::BirthDate => "dates of birth",
        Class::Location => "coordinates",
        Class::Identifier => "identifiers",
    }
}

fn tokens(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if c == '_' || c == '-' || c == ' ' || c == '.' {
            out.push(std::mem::take(&mut word));
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower {
            out.push(std::mem::take(&mut word));
        }
        prev_lower = c.is_lowercase();
        word.extend(c.to_lowercase());
    }
    out.push(word);
    out.retain(|w| !w.is_empty());
    out
}

/// By the column's name (and, for a bare `name`, its table's).
pub fn by_name(table: &str, column: &str, ty: &ColumnType) -> Option<Class> {
    let t = tokens(column);
    let has = |w: &[&str]| t.iter().any(|x| w.contains(&x.as_str()));
    let joined = t.join("_");
    let text = matches!(ty, ColumnType::Text { .. } | ColumnType::Inet);
    if has(&["email", "mail", "emailaddress"]) || joined.contains("e_mail") {
        return text.then_some(Class::Email);
    }
    if has(&["phone", "mobile", "telephone", "tel", "cell", "fax", "msisdn", "phonenumber"]) {
        return text.then_some(Class::Phone);
    }
    if has(&["lat", "lon", "lng", "latitude", "longitude", "geolocation", "coordinates"]) {
        return Some(Class::Location);
    }
    if has(&["cvv", "cvc", "cvv2", "mac", "imei", "vin", "plate"])
        || ["license_plate", "licence_plate", "mac_address", "device_id"].iter().any(|p| joined.contains(p))
    {
        return Some(Class::Identifier);
    }
    if has(&["ssn", "passport", "nino", "bsn", "personnummer", "nif", "nie", "dni", "curp", "aadhaar", "nhs"])
        || ["social_security", "national_id", "tax_id", "driver_license", "drivers_license", "id_number"]
            .iter()
            .any(|p| joined.contains(p))
    {
        return Some(Class::NationalId);
    }
    if has(&["iban"]) || joined.contains("account_number") || joined.contains("bank_account") {
        return Some(Class::Iban);
    }
    if ["card_number", "credit_card", "cc_number", "pan"].iter().any(|p| joined == *p || joined.ends_with(p))
    {
        return Some(Class::Card);
    }
    if has(&["ip", "ipaddr", "ipaddress"]) || joined.contains("remote_addr") {
        return text.then_some(Class::Ip);
    }
    if has(&["birth", "dob", "birthday", "birthdate", "born", "geburtsdatum"]) {
        return Some(Class::BirthDate);
    }
    if has(&["address", "street", "addr", "postcode", "postal", "zip", "zipcode", "postleitzahl", "plz"]) {
        return text.then_some(Class::Address);
    }
    let person_table = tokens(table).iter().any(|w| {
        [
            "people",
            "person",
            "persons",
            "users",
            "user",
            "customers",
            "customer",
            "employees",
            "employee",
            "contacts",
            "contact",
            "members",
            "member",
            "patients",
            "patient",
            "accounts",
            "account",
            "authors",
            "author",
        ]
        .contains(&w.as_str())
    });
    if [
        "first_name",
        "last_name",
        "full_name",
        "surname",
        "given_name",
        "family_name",
        "middle_name",
        "display_name",
        "firstname",
        "lastname",
        "fullname",
        "maiden_name",
    ]
    .contains(&joined.as_str())
        || (joined == "name" && person_table)
        || ["recipient", "holder", "cardholder", "addressee", "beneficiary"].iter().any(|w| has(&[w]))
        || (joined.ends_with("_name")
            && [
                "customer",
                "client",
                "contact",
                "recipient",
                "holder",
                "account_holder",
                "patient",
                "employee",
                "user",
                "sender",
                "owner",
                "person",
                "guest",
                "passenger",
                "driver",
                "member",
                "buyer",
                "seller",
            ]
            .iter()
            .any(|p| joined.strip_suffix("_name") == Some(*p)))
    {
        return text.then_some(Class::PersonName);
    }
    None
}

/// By content: the class most sampled values fit, when at least half do; or
/// free text when any quotes an email address or a phone number.
pub fn by_content(sample: &[String]) -> Option<(Class, f64)> {
    let n = sample.len() as f64;
    let share = |f: &dyn Fn(&str) -> bool| sample.iter().filter(|v| f(v.trim())).count() as f64 / n;
    let whole: [(Class, &dyn Fn(&str) -> bool); 8] = [
        (Class::Email, &is_email),
        (Class::Card, &is_card),
        (Class::Iban, &is_iban),
        (Class::NationalId, &is_national_id),
        (Class::Ip, &is_ip),
        (Class::Phone, &is_phone),
        (Class::PersonName, &is_person_name),
        (Class::Address, &is_street_address),
    ];
    for (class, f) in whole {
        let s = share(f);
        if s >= 0.5 {
            return Some((class, s));
        }
    }
    let quoting = share(&|v: &str| {
        v.split(|c: char| c.is_whitespace() || "<>(),;\"'".contains(c)).any(|w| {
            let w = w.trim_end_matches(['.', ':', '!', '?']);
            is_email(w)
        }) || has_phone_inside(v)
    });
    (quoting > 0.0).then_some((Class::FreeText, quoting))
}

/// JSON paths (keys joined by dots, `*` for array elements) whose key names or
/// string values look personal.
pub fn json_paths(docs: &[Value]) -> Vec<(String, Class)> {
    let mut found: std::collections::BTreeMap<String, (Class, usize, usize)> = Default::default();
    fn walk(
        v: &Value,
        path: &mut Vec<String>,
        found: &mut std::collections::BTreeMap<String, (Class, usize, usize)>,
    ) {
        match v {
            Value::Object(map) => {
                for (k, child) in map {
                    path.push(k.clone());
                    let key_class = if matches!(child, Value::String(_) | Value::Number(_)) {
                        by_name("", k, &ColumnType::Text { max_chars: None, fold_case: false })
                    } else {
                        None
                    };
                    let content = match child {
                        Value::String(s) => by_content(std::slice::from_ref(s)).map(|(c, _)| c),
                        _ => None,
                    };
                    if let Some(class) = key_class.or(content) {
                        let entry = found.entry(path.join(".")).or_insert((class, 0, 0));
                        entry.1 += 1;
                    }
                    walk(child, path, found);
                    path.pop();
                }
            }
            Value::Array(items) => {
                path.push("*".into());
                for item in items {
                    walk(item, path, found);
                }
                path.pop();
            }
            _ => {}
        }
    }
    for d in docs {
        walk(d, &mut Vec::new(), &mut found);
    }
    found.into_iter().map(|(p, (c, _, _))| (p, c)).collect()
}

/// The proposed `json` rule's paths for a JSON finding.
pub fn json_proposal(paths: &[(String, Class)]) -> Spec {
    Spec {
        transform: "json".into(),
        paths: paths
            .iter()
            .map(|(p, c)| {
                let mut spec = c.proposal();
                if spec.transform == "noise" {
                    spec = Spec { transform: "redact".into(), ..Default::default() };
                }
                JsonPathRule { path: p.clone(), spec }
            })
            .collect(),
        ..Default::default()
    }
}

/// `local@domain.tld`.
pub fn is_email(v: &str) -> bool {
    let Some((local, domain)) = v.split_once('@') else { return false };
    let ok_local = !local.is_empty() && local.chars().all(|c| c.is_alphanumeric() || "._%+-'".contains(c));
    let labels: Vec<&str> = domain.split('.').collect();
    ok_local
        && labels.len() >= 2
        && labels.iter().all(|l| !l.is_empty() && l.chars().all(|c| c.is_alphanumeric() || c == '-'))
        && labels.last().is_some_and(|t| t.len() >= 2 && t.chars().all(char::is_alphabetic))
}

/// 7 to 15 digits with phone punctuation, and a `+` or a separator or ten digits or more.
pub fn is_phone(v: &str) -> bool {
    let digits = v.chars().filter(char::is_ascii_digit).count();
    let allowed = v.chars().all(|c| c.is_ascii_digit() || " +-().".contains(c));
    let shaped = v.starts_with('+') || v.contains([' ', '-', '(']) || digits >= 10;
    allowed && (7..=15).contains(&digits) && shaped && !is_national_id(v)
}

fn has_phone_inside(v: &str) -> bool {
    let bytes: Vec<char> = v.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == '+' || bytes[i].is_ascii_digit() || bytes[i] == '(' {
            let mut j = i;
            while j < bytes.len() && (bytes[j].is_ascii_digit() || " +-().".contains(bytes[j])) {
                j += 1;
            }
            let run: String = bytes[i..j].iter().collect();
            if is_phone(run.trim()) && run.trim().chars().filter(char::is_ascii_digit).count() >= 9 {
                return true;
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    false
}

/// 13 to 19 digits (spaces and dashes between) that pass the Luhn check.
pub fn is_card(v: &str) -> bool {
    if !v.chars().all(|c| c.is_ascii_digit() || c == ' ' || c == '-') {
        return false;
    }
    let digits: Vec<u32> = v.chars().filter_map(|c| c.to_digit(10)).collect();
    if !(13..=19).contains(&digits.len()) {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            if i % 2 == 1 {
                if d * 2 > 9 {
                    d * 2 - 9
                } else {
                    d * 2
                }
            } else {
                *d
            }
        })
        .sum();
    sum % 10 == 0
}

/// Two letters, two check digits and up to 30 letters and digits, mod 97 = 1.
pub fn is_iban(v: &str) -> bool {
    let s: String = v.chars().filter(|c| *c != ' ').collect();
    if !(15..=34).contains(&s.len()) || !s.chars().all(|c| c.is_ascii_alphanumeric()) {
        return false;
    }
    let (head, rest) = s.split_at(4);
    if !head[..2].chars().all(|c| c.is_ascii_uppercase()) || !head[2..].chars().all(|c| c.is_ascii_digit()) {
        return false;
    }
    let mut remainder: u64 = 0;
    for c in rest.chars().chain(head.chars()) {
        let n = c.to_digit(36).unwrap_or(0) as u64;
        remainder = if n >= 10 { (remainder * 100 + n) % 97 } else { (remainder * 10 + n) % 97 };
    }
    remainder == 1
}

/// `123-45-6789` (a US social security number's shape), or an 11-digit
/// number in groups (`DDMMYY-NNNNN`).
pub fn is_national_id(v: &str) -> bool {
    let groups: Vec<&str> = v.split('-').collect();
    let shape: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    groups.iter().all(|g| g.chars().all(|c| c.is_ascii_digit())) && (shape == [3, 2, 4] || shape == [6, 5])
}

/// An IPv4 or IPv6 address, with or without a prefix length.
pub fn is_ip(v: &str) -> bool {
    let addr = v.split('/').next().unwrap_or(v);
    addr.parse::<std::net::IpAddr>().is_ok() && (addr.contains('.') || addr.matches(':').count() >= 2)
}

const FIRST_NAMES: &[&str] = &[
    "james",
    "mary",
    "john",
    "patricia",
    "robert",
    "jennifer",
    "michael",
    "linda",
    "william",
    "elizabeth",
    "david",
    "barbara",
    "richard",
    "susan",
    "joseph",
    "jessica",
    "thomas",
    "sarah",
    "charles",
    "karen",
    "daniel",
    "nancy",
    "matthew",
    "lisa",
    "anthony",
    "betty",
    "mark",
    "margaret",
    "paul",
    "sandra",
    "steven",
    "ashley",
    "andrew",
    "emily",
    "joshua",
    "donna",
    "kevin",
    "michelle",
    "brian",
    "carol",
    "george",
    "amanda",
    "edward",
    "melissa",
    "ronald",
    "deborah",
    "timothy",
    "stephanie",
    "jason",
    "rebecca",
    "jeffrey",
    "laura",
    "ryan",
    "sharon",
    "jacob",
    "cynthia",
    "gary",
    "kathleen",
    "nicholas",
    "amy",
    "eric",
    "shirley",
    "jonathan",
    "anna",
    "stephen",
    "angela",
    "larry",
    "ruth",
    "justin",
    "brenda",
    "scott",
    "pamela",
    "frank",
    "nicole",
    "maria",
    "jose",
    "juan",
    "carlos",
    "ana",
    "luis",
    "sofia",
    "lucas",
    "emma",
    "olivia",
    "noah",
    "liam",
    "mia",
    "hannah",
    "lena",
    "anna",
    "max",
    "paul",
    "marie",
    "pierre",
    "jean",
    "giulia",
    "marco",
    "luca",
    "chiara",
    "ahmed",
    "fatima",
    "mohammed",
    "ali",
    "wei",
    "li",
    "yuki",
    "hiroshi",
    "priya",
    "raj",
    "arjun",
    "alice",
    "bob",
    "carol",
    "dave",
    "eve",
    "grace",
    "henry",
    "isabel",
    "jack",
    "kate",
    "leo",
    "nora",
    "oscar",
    "peter",
    "rose",
    "sam",
    "tom",
    "victor",
    "zoe",
    "jane",
    "joe",
    "ben",
    "claire",
    "diana",
    "ella",
];

/// Two or three capitalised words, the first a common first name.
pub fn is_person_name(v: &str) -> bool {
    let words: Vec<&str> = v.split_whitespace().collect();
    (2..=3).contains(&words.len())
        && words.iter().all(|w| {
            w.chars().next().is_some_and(char::is_uppercase)
                && w.chars().all(|c| c.is_alphabetic() || "'-".contains(c))
        })
        && FIRST_NAMES.contains(&words[0].to_lowercase().as_str())
}

/// A house number, then words ending in a street word.
pub fn is_street_address(v: &str) -> bool {
    let head = v.split(',').next().unwrap_or(v);
    let words: Vec<&str> = head.split_whitespace().collect();
    words.len() >= 3
        && words[0].chars().next().is_some_and(|c| c.is_ascii_digit())
        && words.last().is_some_and(|w| {
            [
                "street",
                "st",
                "road",
                "rd",
                "avenue",
                "ave",
                "lane",
                "ln",
                "way",
                "drive",
                "dr",
                "boulevard",
                "blvd",
                "court",
                "ct",
                "place",
                "pl",
                "close",
                "row",
                "terrace",
                "strasse",
                "straße",
                "weg",
                "rue",
            ]
            .contains(&w.trim_end_matches('.').to_lowercase().as_str())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text() -> ColumnType {
        ColumnType::Text { max_chars: None, fold_case: false }
    }

    #[test]
    fn names_say_what_columns_hold() {
        assert_eq!(by_name("t", "contact_email", &text()), Some(Class::Email));
        assert_eq!(by_name("t", "mobilePhone", &text()), Some(Class::Phone));
        assert_eq!(by_name("t", "ssn", &text()), Some(Class::NationalId));
        assert_eq!(by_name("people", "name", &text()), Some(Class::PersonName));
        assert_eq!(by_name("products", "name", &text()), None);
        assert_eq!(by_name("t", "date_of_birth", &ColumnType::Date), Some(Class::BirthDate));
        assert_eq!(by_name("t", "shipping_address", &text()), Some(Class::Address));
        assert_eq!(by_name("t", "status", &text()), None);
        assert_eq!(by_name("orders", "customer_name", &text()), Some(Class::PersonName));
        assert_eq!(by_name("parcels", "recipient", &text()), Some(Class::PersonName));
        assert_eq!(by_name("t", "dni", &text()), Some(Class::NationalId));
        assert_eq!(by_name("t", "geburtsdatum", &ColumnType::Date), Some(Class::BirthDate));
        assert_eq!(by_name("t", "postleitzahl", &text()), Some(Class::Address));
        assert_eq!(by_name("t", "cvv", &text()), Some(Class::Identifier));
        assert_eq!(by_name("t", "device_mac", &text()), Some(Class::Identifier));
        assert_eq!(by_name("t", "lat", &ColumnType::Number), Some(Class::Location));
        assert_eq!(by_name("products", "product_name", &text()), None);
    }

    #[test]
    fn content_says_it_too() {
        assert!(is_card("4111 1111 1111 1111") && !is_card("4111 1111 1111 1112"));
        assert!(is_iban("GB82 WEST 1234 5698 7654 32") && !is_iban("GB83 WEST 1234 5698 7654 32"));
        assert!(is_email("a.b+c@ex-ample.co.uk") && !is_email("not an email"));
        assert!(is_phone("+1 (555) 010-9999") && !is_phone("12345") && !is_phone("123-45-6789"));
        assert!(is_national_id("123-45-6789"));
        assert!(is_ip("10.1.2.3") && is_ip("2001:db8::1") && !is_ip("1.2"));
        assert!(is_person_name("Maria Lopez") && !is_person_name("Blue Widget"));
        let sample = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(by_content(&sample(&["x@y.io", "z@w.org"])).unwrap().0, Class::Email);
        let tickets = sample(&["printer broken", "please write to jane@corp.io about it", "ok"]);
        assert_eq!(by_content(&tickets).unwrap().0, Class::FreeText);
        assert_eq!(by_content(&sample(&["call me at +44 20 7946 0958 today"])).unwrap().0, Class::FreeText);
        assert_eq!(by_content(&sample(&["open", "closed"])), None);
    }

    #[test]
    fn json_paths_are_found_by_key_and_content() {
        let docs: Vec<Value> = vec![
            serde_json::json!({"address": {"street": "1 High Street", "city": "Leeds"}, "tier": "gold"}),
            serde_json::json!({"contacts": [{"email": "a@b.io"}]}),
        ];
        let paths: Vec<String> = json_paths(&docs).into_iter().map(|(p, _)| p).collect();
        assert!(paths.contains(&"address.street".to_string()), "{paths:?}");
        assert!(paths.contains(&"contacts.*.email".to_string()), "{paths:?}");
        assert!(!paths.iter().any(|p| p.contains("tier")), "{paths:?}");
    }
}
