//! `server.forwarded_headers`: each name one of the four forwarding headers, given once.

use toml::Spanned;

use super::super::{ConfigError, ForwardedHeader, ForwardedHeaders};
use super::Validator;

impl Validator<'_> {
    /// `server.forwarded_headers`: the set of names, in any case, each listed once.
    pub(super) fn forwarded_headers(
        &self,
        raw: &Spanned<Vec<Spanned<String>>>,
    ) -> Result<ForwardedHeaders, ConfigError> {
        let mut set = ForwardedHeaders::NONE;
        for (i, name) in raw.get_ref().iter().enumerate() {
            let key = format!("server.forwarded_headers[{i}]");
            let Some(h) = ForwardedHeader::parse(name.get_ref()) else {
                let known: Vec<_> = ForwardedHeader::ALL.iter().map(|h| h.name()).collect();
                return self.err(
                    Some(name.span()),
                    key,
                    format!(
                        "one of {} (any other is not slidegate's to set)",
                        known.join(", ")
                    ),
                );
            };
            if set.contains(h) {
                return self.err(
                    Some(name.span()),
                    key,
                    format!("{} is listed twice", h.name()),
                );
            }
            set = set.with(h);
        }
        Ok(set)
    }
}
