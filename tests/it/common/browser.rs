//! A real headless Debian chromium, driven over WebDriver by Debian's chromedriver (a few JSON
//! calls; no browser is downloaded). Started on a loopback port chosen at run time with a fresh
//! profile directory; the session and the driver end on drop.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::process_group::{own_group, stop_group};

use base64::Engine as _;
use serde_json::{json, Value};

use super::proxy::free_port;
use super::require_tool;

/// A chromedriver process with one chromium session.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    // Removed after the browser is gone.
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Start chromedriver and a headless chromium session (flags as in the developers' brief).
    pub async fn start() -> Browser {
        require_tool("chromium", "chromium");
        require_tool("chromedriver", "chromium-driver");
        let port = free_port();
        let driver = own_group(&mut Command::new("chromedriver"))
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn chromedriver");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let profile = tempfile::tempdir().expect("profile dir");
        let mut browser = Browser {
            driver,
            base,
            session: String::new(),
            http,
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = browser
                .http
                .get(format!("{}/status", browser.base))
                .send()
                .await
                .ok()
                .map(|r| r.status().is_success())
                .unwrap_or(false);
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not answer within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--window-size=1200,900",
                    format!("--user-data-dir={}", browser._profile.path().display()),
                ]
            }
        }}});
        let reply = browser.call("POST", "/session", caps).await;
        browser.session = reply["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {reply}"))
            .to_string();
        browser
    }

    /// One WebDriver command; its `value`. Panics on a WebDriver error.
    async fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.base);
        let req = match method {
            "GET" => self.http.get(&url),
            "DELETE" => self.http.delete(&url),
            _ => self
                .http
                .post(&url)
                .header("content-type", "application/json")
                .body(body.to_string()),
        };
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("{method} {path}: {status} {text}"));
        assert!(status.is_success(), "{method} {path}: {status} {v}");
        v["value"].clone()
    }

    fn s(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    /// Load `url` (returns when the document has loaded).
    pub async fn goto(&self, url: &str) {
        self.call("POST", &self.s("/url"), json!({ "url": url }))
            .await;
    }

    /// Run `script` (a function body; `return` a value) in the page.
    pub async fn eval(&self, script: &str) -> Value {
        self.call(
            "POST",
            &self.s("/execute/sync"),
            json!({"script": script, "args": []}),
        )
        .await
    }

    /// Poll `script` until it returns something other than `null`, `false` or `""` (an element
    /// the page has drawn but not filled yet: one CI run read a card's empty text); that value.
    /// Panics with `what` after `within`.
    pub async fn wait_for(&self, what: &str, script: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let v = self.eval(script).await;
            let not_yet = v.is_null() || v == Value::Bool(false) || v.as_str() == Some("");
            if !not_yet {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not true after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Click the element matching a CSS selector, as a user would (WebDriver element click).
    pub async fn click(&self, css: &str) {
        let el = self
            .call(
                "POST",
                &self.s("/element"),
                json!({"using": "css selector", "value": css}),
            )
            .await;
        // A W3C element reference: an object with one (fixed, long) key holding the id.
        let id = el
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {css}: {el}"))
            .to_string();
        self.call("POST", &self.s(&format!("/element/{id}/click")), json!({}))
            .await;
    }

    /// Save a PNG screenshot of the viewport.
    pub async fn screenshot(&self, path: &Path) {
        let b64 = self.call("GET", &self.s("/screenshot"), Value::Null).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().expect("base64 screenshot"))
            .expect("decode screenshot");
        std::fs::write(path, png).expect("write screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            // Best effort, bounded: ask chromedriver to close chromium, then stop it.
            let _ = std::process::Command::new("curl")
                .args(["-s", "-m", "5", "-X", "DELETE"])
                .arg(format!("{}/session/{}", self.base, self.session))
                .stdout(Stdio::null())
                .status();
        }
        stop_group(&mut self.driver);
    }
}
