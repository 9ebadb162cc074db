//! The Redis scripts, assembled at build time (`build.rs`, by `algo/assemble.rs`)
//! from their skeletons (`lua/<script>/skeleton.lua`) and each kind of limit's file
//! (`lua/kinds/<kind>.lua`), each loaded as one script with one SHA. Each pass of a script
//! dispatches each limit to its kind with one `if`/`elseif` chain on the limit's kind value in
//! ARGV, written out in the text: no function call per kind, so the deciding script costs Redis
//! what the hand-braided one did.

/// The deciding script (each decision over every limit of a route).
pub const SLIDING_WINDOW: &str = include_str!(concat!(env!("OUT_DIR"), "/sliding_window.lua"));

/// The admin inspector's read-only script.
pub const INSPECT: &str = include_str!(concat!(env!("OUT_DIR"), "/inspect.lua"));

/// The `count_status` refund script.
pub const REFUND: &str = include_str!(concat!(env!("OUT_DIR"), "/refund.lua"));

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algo::assemble::assemble;

    fn lua(rel: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("lua")
            .join(rel);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn the_binary_carries_the_scripts_their_parts_assemble_to() {
        // In whatever order: the default kind is always the `else`.
        let kinds: Vec<_> = ["slots", "log"]
            .iter()
            .map(|&n| (n, lua(&format!("kinds/{n}.lua"))))
            .collect();
        for (name, built) in [
            ("sliding_window", SLIDING_WINDOW),
            ("inspect", INSPECT),
            ("refund", REFUND),
        ] {
            let skeleton = lua(&format!("{name}/skeleton.lua"));
            assert_eq!(assemble(&skeleton, &kinds).unwrap(), built, "{name}");
            let marker = built.lines().find(|l| l.trim_start().starts_with("-- @"));
            assert_eq!(marker, None, "a marker was left in {name}");
        }
        assert!(INSPECT.starts_with("#!lua flags=no-writes\n"));
    }

    #[test]
    fn each_pass_is_one_chain_over_the_kinds() {
        // One `if res >= 1000` (slots) per pass (read, decide, answer, and a run's fit and
        // answer), and the log as the `else`.
        assert_eq!(SLIDING_WINDOW.matches("if res >= 1000 then\n").count(), 5);
        assert_eq!(INSPECT.matches("if res >= 1000 then\n").count(), 2);
        assert_eq!(REFUND.matches("if res >= 1000 then\n").count(), 1);
    }
}
