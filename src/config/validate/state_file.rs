//! `store.state_file`: the memory store's windows across a restart
//! (`crate::limiter::memory::persist`).

use std::path::PathBuf;

use super::super::raw::RawStore;
use super::super::{Backend, ConfigError};
use super::Validator;

impl Validator<'_> {
    /// `store.state_file`: with the memory backend only (a shared store keeps its windows
    /// itself), in a directory that exists (the file itself is written at the first stop).
    pub(super) fn state_file(
        &self,
        raw: &RawStore,
        backend: &Backend,
    ) -> Result<Option<PathBuf>, ConfigError> {
        let Some(file) = &raw.state_file else {
            return Ok(None);
        };
        let key = "store.state_file";
        if !matches!(backend, Backend::Memory) {
            return self.err(
                Some(file.span()),
                key,
                "only with backend = \"memory\": a shared store keeps its windows itself",
            );
        }
        let path = file.get_ref();
        if path.as_os_str().is_empty() || path.file_name().is_none() {
            return self.err(Some(file.span()), key, "must name a file");
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !dir.is_dir() {
            return self.err(
                Some(file.span()),
                key,
                format!("directory {} does not exist", dir.display()),
            );
        }
        if path.is_dir() {
            return self.err(Some(file.span()), key, "is a directory");
        }
        Ok(Some(path.clone()))
    }
}
