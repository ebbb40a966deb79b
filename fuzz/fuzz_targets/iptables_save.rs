//! `iptables-save -t nat` of a pod's namespace, as the agent reads it
//! (`interceptor_parse::iptables`): which of proxy-init's chains and jumps are already there
//! (`existing`: what it writes, flushes, or leaves) and which lines are its own (`ours`: what it
//! compares with its record). The table is the pod's too: a container with `NET_ADMIN` or
//! another CNI writes chains and rules there, and none of them may pass for ours.
//!
//! Input: the output (UTF-8), any lines.
#![no_main]

use interceptor_parse::iptables::{Existing, OUTPUT_CHAIN, REDIRECT_CHAIN, existing, ours};
use libfuzzer_sys::fuzz_target;

/// The jumps proxy-init writes (SPEC.md), as iptables-save lists them.
const PREROUTING_JUMP: &str = r#"-A PREROUTING -m comment --comment "proxy-init/install-proxy-init-prerouting" -j PROXY_INIT_REDIRECT"#;
const OUTPUT_JUMP: &str =
    r#"-A OUTPUT -m comment --comment "proxy-init/install-proxy-init-output" -j PROXY_INIT_OUTPUT"#;

fuzz_target!(|data: &[u8]| {
    let Ok(save) = std::str::from_utf8(data) else {
        return;
    };
    let found = existing(save);
    let mine = ours(save);
    let lines: Vec<&str> = save.lines().collect();
    let mut at = 0;
    for line in &mine {
        // In the order listed, each a line of the output.
        at += lines[at..]
            .iter()
            .position(|l| l == line)
            .expect("a line of ours is a line of the output")
            + 1;
        assert!(
            line.contains(REDIRECT_CHAIN) || line.contains(OUTPUT_CHAIN),
            "a line of ours names our chain: {line}"
        );
    }
    // A jump is found exactly when it is one of our lines.
    assert_eq!(
        found.prerouting_jump,
        mine.iter().any(|l| l.starts_with("-A PREROUTING ")),
        "{found:?} {mine:?}"
    );
    assert_eq!(
        found.output_jump,
        mine.iter().any(|l| l.starts_with("-A OUTPUT ")),
        "{found:?} {mine:?}"
    );

    // Without a line naming our chains, nothing is ours.
    let others: String = save
        .lines()
        .filter(|l| !l.contains(REDIRECT_CHAIN) && !l.contains(OUTPUT_CHAIN))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(existing(&others), Existing::default(), "{others:?}");
    assert!(ours(&others).is_empty(), "{others:?}");

    // What proxy-init writes is found after whatever the pod wrote (a last line ending in a
    // carriage return would become another line before the newline added).
    if save.ends_with('\r') {
        return;
    }
    let written = format!(
        "{save}\n:{REDIRECT_CHAIN} - [0:0]\n:{OUTPUT_CHAIN} - [0:0]\n{PREROUTING_JUMP}\n{OUTPUT_JUMP}\n"
    );
    assert_eq!(
        existing(&written),
        Existing {
            redirect_chain: true,
            output_chain: true,
            prerouting_jump: true,
            output_jump: true,
        }
    );
    let after = ours(&written);
    assert_eq!(
        after.len(),
        mine.len() + 2,
        "our two jumps are added to ours"
    );
    assert_eq!(&after[mine.len()..], [PREROUTING_JUMP, OUTPUT_JUMP]);
});
