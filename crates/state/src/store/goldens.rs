//! Goldens and their generations in the store.

use rusqlite::{params, OptionalExtension};

use super::*;

impl Store {
    /// Records a new golden with its first generation.
    pub fn insert_golden(&mut self, manifest: &Manifest, source: &Source) -> Result<()> {
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute(
            "INSERT INTO goldens (name, current_generation, source) VALUES (?1, ?2, ?3)",
            params![manifest.name, manifest.generation, to_json(source)],
        )?;
        tx.execute(
            "INSERT INTO generations (golden, generation, manifest) VALUES (?1, ?2, ?3)",
            params![manifest.name, manifest.generation, to_json(manifest)],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Records a new generation and makes it current.
    pub fn add_generation(&mut self, manifest: &Manifest) -> Result<()> {
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let present = tx.prepare("SELECT 1 FROM goldens WHERE name = ?1")?.exists([&manifest.name])?;
        if !present {
            return Err(golden_not_found(&manifest.name));
        }
        tx.execute(
            "INSERT INTO generations (golden, generation, manifest) VALUES (?1, ?2, ?3)",
            params![manifest.name, manifest.generation, to_json(manifest)],
        )?;
        tx.execute(
            "UPDATE goldens SET current_generation = ?2 WHERE name = ?1",
            params![manifest.name, manifest.generation],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// The stored source of a golden, secrets included (for refresh only).
    pub fn golden_source(&self, name: &str) -> Result<Source> {
        let text: Option<String> = self
            .conn
            .query_row("SELECT source FROM goldens WHERE name = ?1", [name], |r| r.get(0))
            .optional()?;
        match text {
            Some(t) => from_json(&t),
            None => Err(golden_not_found(name)),
        }
    }

    /// Records where a golden's Redis part comes from (a URL with its password:
    /// the store is root's alone), for refresh.
    pub fn set_redis_source(
        &mut self,
        name: &str,
        source: Option<&airlock_core::records::redis::RedisSource>,
    ) -> Result<()> {
        self.conn.execute(
            "UPDATE goldens SET redis_source = ?2 WHERE name = ?1",
            params![name, source.map(to_json)],
        )?;
        Ok(())
    }

    /// Where a golden's Redis part comes from, if it has one.
    pub fn golden_redis_source(
        &self,
        name: &str,
    ) -> Result<Option<airlock_core::records::redis::RedisSource>> {
        let text: Option<Option<String>> = self
            .conn
            .query_row("SELECT redis_source FROM goldens WHERE name = ?1", [name], |r| r.get(0))
            .optional()?;
        match text {
            Some(Some(t)) => from_json(&t).map(Some),
            Some(None) => Ok(None),
            None => Err(golden_not_found(name)),
        }
    }

    /// Keeps a golden's masking key (hex), for its refreshes: the store is the
    /// daemon's alone, and nothing else ever holds the key.
    pub fn set_mask_key(&mut self, name: &str, key_hex: &str) -> Result<()> {
        self.conn.execute("UPDATE goldens SET mask_key = ?2 WHERE name = ?1", params![name, key_hex])?;
        Ok(())
    }

    /// A golden's masking key (hex), if it is masked.
    pub fn mask_key(&self, name: &str) -> Result<Option<String>> {
        let text: Option<Option<String>> = self
            .conn
            .query_row("SELECT mask_key FROM goldens WHERE name = ?1", [name], |r| r.get(0))
            .optional()?;
        text.ok_or_else(|| golden_not_found(name))
    }

    /// The manifest of one generation of a golden.
    pub fn manifest(&self, name: &str, generation: i64) -> Result<Manifest> {
        let text: Option<String> = self
            .conn
            .query_row(
                "SELECT manifest FROM generations WHERE golden = ?1 AND generation = ?2",
                params![name, generation],
                |r| r.get(0),
            )
            .optional()?;
        match text {
            Some(t) => from_json(&t),
            None => Err(golden_not_found(name)),
        }
    }

    /// The PostgreSQL major of one generation of a golden, read from its
    /// manifest in the store (forks ask for it: no whole manifest is parsed).
    pub fn generation_major(&self, name: &str, generation: i64) -> Result<u32> {
        let row: Option<(Option<i64>, Option<String>)> = self
            .conn
            .query_row(
                "SELECT json_extract(manifest, '$.postgres_major'), json_extract(manifest, '$.postgres_version')
                 FROM generations WHERE golden = ?1 AND generation = ?2",
                params![name, generation],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let (major, version) = row.ok_or_else(|| golden_not_found(name))?;
        let field = major.and_then(|m| u32::try_from(m).ok()).unwrap_or(0);
        Ok(crate::golden::recorded_major(field, version.as_deref().unwrap_or("")))
    }

    /// One golden with its generations and sandbox count.
    pub fn golden(&self, name: &str) -> Result<Golden> {
        let row: Option<(i64, String, i64)> = self
            .conn
            .query_row(
                "SELECT current_generation, source, pool_size FROM goldens WHERE name = ?1",
                [name],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let (current_generation, source, pool_size) = row.ok_or_else(|| golden_not_found(name))?;
        let source: Source = from_json(&source)?;
        let mut stmt =
            self.conn.prepare("SELECT manifest FROM generations WHERE golden = ?1 ORDER BY generation")?;
        let generations = stmt
            .query_map([name], |r| r.get::<_, String>(0))?
            .map(|t| from_json(&t?))
            .collect::<Result<Vec<Manifest>>>()?;
        let (sandboxes, pooled): (i64, i64) = self.conn.query_row(
            "SELECT count(*) FILTER (WHERE state <> 'pooled'), count(*) FILTER (WHERE state = 'pooled')
             FROM sandboxes WHERE golden = ?1",
            [name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok(Golden {
            name: name.to_owned(),
            current_generation,
            sandboxes,
            pool_size,
            pooled,
            generations,
            source: source.redacted(),
        })
    }

    /// Sets how many sandboxes a golden's warm pool keeps.
    pub fn set_pool_size(&mut self, name: &str, size: i64) -> Result<()> {
        if self.conn.execute("UPDATE goldens SET pool_size = ?2 WHERE name = ?1", params![name, size])? == 0 {
            return Err(golden_not_found(name));
        }
        Ok(())
    }

    /// Every golden, by name.
    pub fn goldens(&self) -> Result<Vec<Golden>> {
        let names: Vec<String> = self
            .conn
            .prepare("SELECT name FROM goldens ORDER BY name")?
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        names.iter().map(|n| self.golden(n)).collect()
    }

    /// Generations of a golden that some sandbox still uses.
    pub fn generations_in_use(&self, name: &str) -> Result<Vec<i64>> {
        let mut stmt = self.conn.prepare("SELECT DISTINCT generation FROM sandboxes WHERE golden = ?1")?;
        let rows = stmt.query_map([name], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    /// Forgets a generation just added, making the newest left current again
    /// (a refresh or promotion that could not go on record).
    pub fn undo_generation(&mut self, name: &str, generation: i64) -> Result<()> {
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute(
            "DELETE FROM generations WHERE golden = ?1 AND generation = ?2",
            params![name, generation],
        )?;
        tx.execute(
            "UPDATE goldens SET current_generation = (SELECT max(generation) FROM generations WHERE golden = ?1) WHERE name = ?1",
            [name],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Forgets one generation.
    pub fn delete_generation(&mut self, name: &str, generation: i64) -> Result<()> {
        self.conn.execute(
            "DELETE FROM generations WHERE golden = ?1 AND generation = ?2",
            params![name, generation],
        )?;
        Ok(())
    }

    /// Forgets a golden and all its generations.
    pub fn delete_golden(&mut self, name: &str) -> Result<()> {
        self.conn.execute("DELETE FROM goldens WHERE name = ?1", [name])?;
        Ok(())
    }
}
