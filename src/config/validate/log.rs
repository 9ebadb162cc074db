//! `[log]`: where access lines go and how they are written; a `log_format` is parsed here,
//! once, and refused naming its key and line.

use super::super::log_format::LogFormat;
use super::super::raw::RawLog;
use super::super::{AccessFormat, AccessTarget, ConfigError, LogSettings};
use super::Validator;

impl Validator<'_> {
    /// `[log]`.
    pub(super) fn log(&self, raw: RawLog) -> Result<LogSettings, ConfigError> {
        let access = match raw.access.get_ref().as_str() {
            "off" => AccessTarget::Off,
            "stdout" => AccessTarget::Stdout,
            "" => {
                return self.err(
                    Some(raw.access.span()),
                    "log.access",
                    "expected \"off\", \"stdout\" or a file path",
                )
            }
            path => AccessTarget::File(path.into()),
        };
        let format = *raw.format.get_ref();
        let log_format = match &raw.log_format {
            None => None,
            Some(text) if format != AccessFormat::Combined => {
                return self.err(
                    Some(text.span()),
                    "log.log_format",
                    "is a combined line's format: set format = \"combined\" with it",
                );
            }
            Some(text) => match text.get_ref().parse::<LogFormat>() {
                Ok(parsed) => Some(parsed),
                Err(e) => return self.err(Some(text.span()), "log.log_format", e.to_string()),
            },
        };
        Ok(LogSettings {
            access,
            format,
            log_format,
        })
    }
}
