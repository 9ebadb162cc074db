//! The Redis commands slidegate sends, for an ACL user that may run only those, and the check
//! that the connected user may run each of them.
//!
//! Redis checks the commands a script runs against the ACL too, but a denial inside a script
//! only says "The user executing the script can't run this command" (Redis 7.0), without the
//! command. So after each (re)connect, before the gate opens, every command is sent once on its
//! own, pipelined in one round trip, against a probe key under the prefix; a `NOPERM` reply names
//! the command, and the store stays not ready (`/readyz` 503, routes on `on_error`) with an
//! ERROR line naming it until the user is granted it (no restart needed).

use redis::{ErrorKind, ServerErrorKind};

use super::conn::Conn;
use crate::limiter::StoreError;

/// Every command slidegate needs on one Redis, with why. `ACL SETUSER <user> on ><password>
/// ~<prefix>:* resetchannels -@all` plus `+` each of these is a minimal user; a Cluster also
/// needs [`CLUSTER_COMMANDS`].
pub const REQUIRED_COMMANDS: &[&str] = &[
    // The store itself: decisions, the script's upload, health.
    "EVALSHA",
    "SCRIPT|LOAD",
    "PING",
    // Inside the sliding-window script (lua/sliding_window/skeleton.lua
    // with lua/kinds/*.lua), lua/inspect/skeleton.lua
    // lua/refund/skeleton.lua and lua/renew/script.lua.
    "TIME",
    "LLEN",
    "LINDEX",
    "LRANGE",
    "RPUSH",
    "LPOP",
    "LTRIM",
    "LREM",
    "PTTL",
    "PEXPIRE",
    // Slotted limits' counters (SLOTS in lua/kinds/slots/).
    "GET",
    "SET",
    "SETRANGE",
    // The script's cleanup, and the admin inspector's reset.
    "DEL",
];

/// What a Cluster client sends beyond [`REQUIRED_COMMANDS`]: the slot map.
pub const CLUSTER_COMMANDS: &[&str] = &["CLUSTER|SLOTS"];

/// One probe per command of [`REQUIRED_COMMANDS`], in its order, on `key` (which no decision
/// uses: its bucket is not a route's). Harmless: the key is created, trimmed, overwritten and
/// deleted.
fn probes(key: &str) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    // An all-zero SHA is never loaded: a permitted EVALSHA answers NOSCRIPT.
    pipe.cmd("EVALSHA").arg("0".repeat(40)).arg(0);
    pipe.cmd("SCRIPT").arg("LOAD").arg("return 1");
    pipe.cmd("PING");
    pipe.cmd("TIME");
    pipe.cmd("LLEN").arg(key);
    pipe.cmd("LINDEX").arg(key).arg(0);
    pipe.cmd("LRANGE").arg(key).arg(0).arg(0);
    pipe.cmd("RPUSH").arg(key).arg(0);
    pipe.cmd("LPOP").arg(key);
    pipe.cmd("LTRIM").arg(key).arg(0).arg(-1);
    pipe.cmd("LREM").arg(key).arg(-1).arg(0);
    pipe.cmd("PTTL").arg(key);
    pipe.cmd("PEXPIRE").arg(key).arg(1000);
    pipe.cmd("GET").arg(key);
    pipe.cmd("SET").arg(key).arg(0).arg("PX").arg(1000);
    pipe.cmd("SETRANGE").arg(key).arg(0).arg(1);
    pipe.cmd("DEL").arg(key);
    pipe.ignore_errors();
    pipe
}

impl Conn {
    /// `Err(Backend)` naming the first command of [`REQUIRED_COMMANDS`] the user may not run;
    /// any other failure is the caller's to judge (the next PING will tell).
    pub(super) async fn check_permissions(&mut self, prefix: &str) -> Result<(), StoreError> {
        let key = format!("{prefix}:{{slidegate-acl-probe}}:0");
        let replies: Vec<redis::RedisResult<redis::Value>> =
            probes(&key)
                .query_async(self)
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let denied = REQUIRED_COMMANDS
            .iter()
            .zip(&replies)
            .find_map(|(cmd, r)| match r {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) => Some((cmd, e)),
                _ => None,
            });
        match denied {
            Some((cmd, e)) => Err(StoreError::Backend(format!(
                "the Redis user may not run {cmd}, which slidegate needs (grant it with \
                 ACL SETUSER <user> +{}): {e}",
                cmd.to_ascii_lowercase()
            ))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_probe_per_required_command_in_order() {
        let pipe = probes("p:{x}:0");
        let sent: Vec<String> = pipe
            .cmd_iter()
            .map(|c| {
                let args: Vec<String> = c
                    .args_iter()
                    .take(2)
                    .map(|a| match a {
                        redis::Arg::Simple(b) => String::from_utf8_lossy(b).to_uppercase(),
                        _ => String::new(),
                    })
                    .collect();
                match args[0].as_str() {
                    "SCRIPT" => format!("SCRIPT|{}", args[1]),
                    _ => args[0].clone(),
                }
            })
            .collect();
        assert_eq!(sent, REQUIRED_COMMANDS);
    }
}
