//! Wall-clock timestamps: stored as Unix milliseconds, shown as RFC 3339.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A point in time, in milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The current time.
    pub fn now() -> Self {
        let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        Timestamp(d.as_millis() as i64)
    }

    /// This time plus a duration.
    pub fn plus(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(d.as_millis() as i64))
    }

    /// How long from now until this time (zero if it has passed).
    pub fn remaining(self) -> Duration {
        Duration::from_millis(self.0.saturating_sub(Timestamp::now().0).max(0) as u64)
    }

    /// RFC 3339 text in UTC, to the millisecond.
    pub fn to_rfc3339(self) -> String {
        let t = UNIX_EPOCH + Duration::from_millis(self.0.max(0) as u64);
        humantime::format_rfc3339_millis(t).to_string()
    }
}

/// In the OpenAPI document: an RFC 3339 date-time string, as serialized.
impl utoipa::PartialSchema for Timestamp {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
            .into()
    }
}

impl utoipa::ToSchema for Timestamp {}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let t = humantime::parse_rfc3339_weak(&text).map_err(serde::de::Error::custom)?;
        let ms = t.duration_since(UNIX_EPOCH).map_err(serde::de::Error::custom)?.as_millis();
        Ok(Timestamp(ms as i64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_json() {
        let t = Timestamp(1_700_000_000_123);
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, "\"2023-11-14T22:13:20.123Z\"");
        assert_eq!(serde_json::from_str::<Timestamp>(&json).unwrap(), t);
    }
}
