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

    /// A kind's text: its file, or its folder's files in name order (as `build.rs` reads them).
    fn kind(name: &str) -> String {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua/kinds");
        if !dir.join(name).is_dir() {
            return lua(&format!("kinds/{name}.lua"));
        }
        let mut files: Vec<_> = std::fs::read_dir(dir.join(name))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|f| f.ends_with(".lua"))
            .collect();
        files.sort();
        let texts: Vec<String> = files
            .iter()
            .map(|f| lua(&format!("kinds/{name}/{f}")))
            .collect();
        crate::limiter::algo::assemble::kind_text(&texts)
    }

    #[test]
    fn the_binary_carries_the_scripts_their_parts_assemble_to() {
        // Every kind, by name as `build.rs` reads them (the default kind is always the `else`).
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua/kinds");
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .map(|f| f.strip_suffix(".lua").map_or(f.clone(), str::to_owned))
            .collect();
        names.sort();
        let kinds: Vec<_> = names.iter().map(|n| (n.as_str(), kind(n))).collect();
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
    fn a_section_using_a_name_its_skeleton_lacks_fails_the_assembly() {
        use crate::limiter::algo::assemble::AssembleError;
        // A local of another pass (`epoch` is pass 3's) read in pass 2, and a scratch table
        // misspelt: each is a build error, not a `nil` in Redis.
        for (from, to, name) in [
            ("local e = 0\n", "local e = epoch\n", "epoch"),
            (
                "st[j - 5], st[j - 4], st[j - 3] = c, h, last",
                "sst[j - 5] = c",
                "sst",
            ),
        ] {
            let log = kind("log");
            assert!(log.contains(from), "{from}");
            let kinds = [("log", log.replacen(from, to, 1)), ("slots", kind("slots"))];
            let err = assemble(&lua("sliding_window/skeleton.lua"), &kinds).unwrap_err();
            assert!(
                matches!(&err, AssembleError::UnknownName(k, _, n) if k == "log" && n == name),
                "{err}"
            );
        }
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
