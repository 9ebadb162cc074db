use super::*;

fn scan(source: &str, limit: usize, event_stream: bool) -> Scan {
    let paths = Arc::new(UsagePaths::parse(source).unwrap());
    Scan::new(paths, limit, event_stream)
}

/// Every report on the way (each chunk's), then the end's.
fn run(scan: &mut Scan, chunks: &[&[u8]]) -> (Vec<Reported>, Option<Reported>) {
    let seen = chunks.iter().filter_map(|c| scan.feed(c)).collect();
    (seen, scan.finish())
}

const OPENAI: &[u8] = br#"{"id":"c1","choices":[{"message":{"content":"hi"}}],
  "usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}"#;

#[test]
fn a_json_body_is_read_at_its_end_in_any_cut() {
    for at in 0..OPENAI.len() {
        let (a, b) = OPENAI.split_at(at);
        let mut s = scan("usage.total_tokens", 1 << 20, false);
        assert_eq!(run(&mut s, &[a, b]), (vec![], Some(Reported::Cost(42))));
    }
    let mut s = scan(
        "usage.prompt_tokens+usage.completion_tokens",
        1 << 20,
        false,
    );
    assert_eq!(run(&mut s, &[OPENAI]).1, Some(Reported::Cost(42)));
    let mut s = scan("usage.total_tokens+usage.cached", 1 << 20, false);
    assert_eq!(
        run(&mut s, &[OPENAI]).1,
        None,
        "one path missing: no report"
    );
    for body in [
        &br#"{"usage":null}"#[..],
        b"not json",
        b"",
        br#"{"usage":{"total_tokens":"#,
    ] {
        let mut s = scan("usage.total_tokens", 1 << 20, false);
        assert_eq!(run(&mut s, &[body]).1, None, "{body:?}");
    }
    for body in [
        &br#"{"usage":{"total_tokens":-1}}"#[..],
        br#"{"usage":{"total_tokens":4294967296}}"#,
    ] {
        let mut s = scan("usage.total_tokens", 1 << 20, false);
        assert_eq!(run(&mut s, &[body]).1, Some(Reported::Invalid));
    }
}

#[test]
fn a_body_over_the_bound_is_not_read() {
    let mut s = scan("usage.total_tokens", OPENAI.len(), false);
    assert_eq!(
        run(&mut s, &[OPENAI]).1,
        Some(Reported::Cost(42)),
        "at the bound"
    );
    let mut s = scan("usage.total_tokens", OPENAI.len() - 1, false);
    let (a, b) = OPENAI.split_at(10);
    let said = run(&mut s, &[a, b]);
    assert_eq!(said, (vec![Reported::Oversized], Some(Reported::Oversized)));
}

const OPENAI_STREAM: &[u8] = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n\
data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}],\"usage\":null}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n\
data: [DONE]\n\n";

#[test]
fn a_stream_reports_at_its_last_event_carrying_the_path() {
    for at in 0..OPENAI_STREAM.len() {
        let (a, b) = OPENAI_STREAM.split_at(at);
        let mut s = scan("usage.total_tokens", 1 << 10, true);
        let (seen, end) = run(&mut s, &[a, b]);
        assert_eq!(
            (seen, end),
            (vec![Reported::Cost(7)], Some(Reported::Cost(7))),
            "cut at {at}"
        );
    }
    // Anthropic: input tokens in message_start, output tokens (cumulative) in each
    // message_delta: each path from the last event carrying it.
    let anthropic = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":10}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let mut s = scan(
        "message.usage.input_tokens+usage.output_tokens",
        1 << 10,
        true,
    );
    let (seen, end) = run(&mut s, &[anthropic]);
    assert_eq!(end, Some(Reported::Cost(40)));
    assert_eq!(seen, vec![Reported::Cost(40)], "one chunk: one report");
    // A stream cut before its usage event reports nothing.
    let cut = &OPENAI_STREAM[..OPENAI_STREAM.len() - 60];
    let mut s = scan("usage.total_tokens", 1 << 10, true);
    assert_eq!(run(&mut s, &[cut]), (vec![], None));
}

#[test]
fn an_event_over_the_bound_ends_the_scan() {
    let usage = b"data: {\"usage\":{\"total_tokens\":3}}\n\n";
    let big = format!("data: {{\"pad\":\"{}\"}}\n\n", "x".repeat(100));
    let mut s = scan("usage.total_tokens", 64, true);
    let (seen, end) = run(&mut s, &[usage, big.as_bytes(), OPENAI_STREAM]);
    assert_eq!(seen, vec![Reported::Cost(3), Reported::Oversized]);
    assert_eq!(
        end,
        Some(Reported::Oversized),
        "a later usage event is not read"
    );
}
