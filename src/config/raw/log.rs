//! `[log]`: the access log's target and format (`log_format`: nginx's syntax, parsed by
//! [`crate::config::log_format`]).

use serde::{Deserialize, Serialize};
use toml::Spanned;

/// `[log]`.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(in crate::config) struct RawLog {
    /// `"off"`, `"stdout"` or a file path.
    #[serde(default = "default_access")]
    pub access: Spanned<String>,
    #[serde(default = "default_format")]
    pub format: Spanned<crate::config::AccessFormat>,
    /// nginx's `log_format` syntax, with `format = "combined"`.
    pub log_format: Option<Spanned<String>>,
}

impl Default for RawLog {
    fn default() -> Self {
        RawLog {
            access: default_access(),
            format: default_format(),
            log_format: None,
        }
    }
}

fn default_format() -> Spanned<crate::config::AccessFormat> {
    Spanned::new(0..0, crate::config::AccessFormat::default())
}

fn default_access() -> Spanned<String> {
    Spanned::new(0..0, "off".into())
}
