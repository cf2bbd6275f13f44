//! Which extensions an import installs: those that give a fork no reach
//! outside itself.
//!
//! An import's extensions are installed by the admin, from the host's
//! packages, because many need a superuser to create. Whatever they can do
//! then every fork's agent can do: `dblink` and `postgres_fdw` connect to any
//! server (a host's unix socket included), `file_fdw` and `adminpack` read and
//! write server files, `pageinspect` and its kind read raw pages. So an
//! import installs only the extensions below, each of which works on its own
//! database's data alone; any other the source has is left out, with a line
//! in the fidelity report, unless the golden's request names it
//! (`--allow-extension NAME`). Even then the fork's view of the host
//! (`airlock_host::rootfs`) holds no socket or file outside the sandbox.

use std::collections::BTreeSet;

/// Extensions that reach nothing outside their own database: PostgreSQL's
/// contrib modules of that kind, and the common third-party ones (PostGIS with
/// its out-of-database rasters and GDAL drivers off, as they are unless a
/// superuser turns them on; pgvector; pg_partman; H3).
pub const CONTAINED: &[&str] = &[
    "address_standardizer",
    "address_standardizer_data_us",
    "autoinc",
    "bloom",
    "btree_gin",
    "btree_gist",
    "citext",
    "cube",
    "dict_int",
    "dict_xsyn",
    "earthdistance",
    "fuzzystrmatch",
    "h3",
    "h3_postgis",
    "hstore",
    "insert_username",
    "intagg",
    "intarray",
    "isn",
    "lo",
    "ltree",
    "moddatetime",
    "pg_partman",
    "pg_trgm",
    "pgcrypto",
    "pgrouting",
    "plpgsql",
    "postgis",
    "postgis_raster",
    "postgis_sfcgal",
    "postgis_tiger_geocoder",
    "postgis_topology",
    "refint",
    "seg",
    "tablefunc",
    "tcn",
    "tsm_system_rows",
    "tsm_system_time",
    "unaccent",
    "uuid-ossp",
    "vector",
];

/// Which extensions an import may install: [`CONTAINED`] and those a request
/// allowed by name.
#[derive(Debug, Clone, Default)]
pub struct Allowed {
    extra: BTreeSet<String>,
}

impl Allowed {
    /// [`CONTAINED`], and `extra` besides.
    pub fn with(extra: &[String]) -> Allowed {
        Allowed { extra: extra.iter().cloned().collect() }
    }

    /// Whether `name` may be installed.
    pub fn allows(&self, name: &str) -> bool {
        CONTAINED.contains(&name) || self.extra.contains(name)
    }

    /// The note the fidelity report carries for an extension left out.
    pub fn left_out(name: &str, because: Option<&str>) -> String {
        match because {
            None => format!(
                "extension {name}: it can reach outside the fork (other servers, files or raw pages); \
                 give --allow-extension {name} to install it anyway"
            ),
            Some(needed) => format!(
                "extension {name}: it needs extension {needed}, which can reach outside the fork; \
                 give --allow-extension {needed} to install both"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reaching_extensions_need_a_name_to_be_installed() {
        let plain = Allowed::default();
        for reaching in ["dblink", "postgres_fdw", "file_fdw", "adminpack", "pageinspect", "pg_buffercache"] {
            assert!(!plain.allows(reaching), "{reaching}");
        }
        assert!(plain.allows("postgis") && plain.allows("pgcrypto"));
        assert!(Allowed::with(&["dblink".into()]).allows("dblink"));
    }
}
