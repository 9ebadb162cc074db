// Copyright 2026 Cloudflare, Inc.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
// http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

use crate::*;
use bytes::Bytes;
use http::header;

#[derive(Debug, Clone)]
pub struct CaseHeaderName(Bytes);

impl CaseHeaderName {
    pub fn new(name: String) -> Self {
        CaseHeaderName(name.into())
    }
}

impl CaseHeaderName {
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    pub fn from_slice(buf: &[u8]) -> Self {
        CaseHeaderName(Bytes::copy_from_slice(buf))
    }
}

/// A trait that converts into case-sensitive header names.
pub trait IntoCaseHeaderName {
    fn into_case_header_name(self) -> CaseHeaderName;

    /// The name as a map key and as written on HTTP/1. By default the key is parsed from the
    /// written name; a name that is parsed already (a [`HeaderName`], or a
    /// `(HeaderName, &'static str)` pair giving its case) hands it over instead, so a name
    /// inserted on every request is not parsed on every request.
    fn into_header_names(self) -> Result<(HeaderName, CaseHeaderName)>
    where
        Self: Sized,
    {
        let case_header_name = self.into_case_header_name();
        let header_name = HeaderName::from_bytes(case_header_name.as_slice())
            .or_err(InvalidHTTPHeader, "invalid header name")?;
        Ok((header_name, case_header_name))
    }
}

impl IntoCaseHeaderName for CaseHeaderName {
    fn into_case_header_name(self) -> CaseHeaderName {
        self
    }
}

impl IntoCaseHeaderName for String {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(self.into())
    }
}

impl IntoCaseHeaderName for &'static str {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(self.into())
    }
}

impl IntoCaseHeaderName for HeaderName {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(titled_header_name(&self))
    }

    fn into_header_names(self) -> Result<(HeaderName, CaseHeaderName)> {
        let case_header_name = CaseHeaderName(titled_header_name(&self));
        Ok((self, case_header_name))
    }
}

impl IntoCaseHeaderName for &HeaderName {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(titled_header_name(self))
    }

    fn into_header_names(self) -> Result<(HeaderName, CaseHeaderName)> {
        Ok((self.clone(), CaseHeaderName(titled_header_name(self))))
    }
}

/// A parsed name with the case it is written in on HTTP/1, e.g.
/// `(HeaderName::from_static("x-request-id"), "X-Request-Id")`: nothing is parsed or copied
/// when it is inserted. The two must name the same header (ASCII case aside).
impl IntoCaseHeaderName for (HeaderName, &'static str) {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(Bytes::from_static(self.1.as_bytes()))
    }

    fn into_header_names(self) -> Result<(HeaderName, CaseHeaderName)> {
        debug_assert!(self.0.as_str().eq_ignore_ascii_case(self.1));
        Ok((self.0, CaseHeaderName(Bytes::from_static(self.1.as_bytes()))))
    }
}

impl IntoCaseHeaderName for Bytes {
    fn into_case_header_name(self) -> CaseHeaderName {
        CaseHeaderName(self)
    }
}

fn titled_header_name(header_name: &HeaderName) -> Bytes {
    titled_header_name_str(header_name).map_or_else(
        || Bytes::copy_from_slice(header_name.as_str().as_bytes()),
        |s| Bytes::from_static(s.as_bytes()),
    )
}

pub(crate) fn titled_header_name_str(header_name: &HeaderName) -> Option<&'static str> {
    Some(match *header_name {
        header::ACCEPT_RANGES => "Accept-Ranges",
        header::AGE => "Age",
        header::CACHE_CONTROL => "Cache-Control",
        header::CONNECTION => "Connection",
        header::CONTENT_TYPE => "Content-Type",
        header::CONTENT_ENCODING => "Content-Encoding",
        header::CONTENT_LENGTH => "Content-Length",
        header::DATE => "Date",
        header::TRANSFER_ENCODING => "Transfer-Encoding",
        header::HOST => "Host",
        header::SERVER => "Server",
        header::SET_COOKIE => "Set-Cookie",
        // TODO: add more const header here to map to their titled case
        // TODO: automatically upper case the first letter?
        _ => {
            return None;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_case_header_name() {
        assert_eq!("FoO".into_case_header_name().as_slice(), b"FoO");
        assert_eq!("FoO".to_string().into_case_header_name().as_slice(), b"FoO");
        assert_eq!(header::SERVER.into_case_header_name().as_slice(), b"Server");
    }

    #[test]
    fn header_names_parsed_or_handed_over_agree() {
        let x_id = HeaderName::from_static("x-request-id");
        let cases = [
            "X-Request-Id".into_header_names().unwrap(),
            (x_id.clone(), "X-Request-Id").into_header_names().unwrap(),
        ];
        for (name, case) in &cases {
            assert_eq!(name, &x_id);
            assert_eq!(case.as_slice(), b"X-Request-Id");
        }
        let (name, case) = header::SERVER.into_header_names().unwrap();
        assert_eq!((name, case.as_slice()), (header::SERVER, &b"Server"[..]));
        let (name, case) = (&header::HOST).into_header_names().unwrap();
        assert_eq!((name, case.as_slice()), (header::HOST, &b"Host"[..]));
        assert!("bad name".into_header_names().is_err());
    }
}
