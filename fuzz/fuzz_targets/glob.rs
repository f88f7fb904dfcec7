//! `glob::matches` on an arbitrary pattern and key: never panics and stays
//! polynomial (libFuzzer's `-timeout` catches a blowup). The first two bytes
//! say where the pattern ends and the key begins.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_proto::glob::matches;

fuzz_target!(|data: &[u8]| {
    let (split, rest) = match data {
        [a, b, rest @ ..] => (usize::from(u16::from_le_bytes([*a, *b])), rest),
        _ => return,
    };
    let (pattern, key) = rest.split_at(split.min(rest.len()));
    let _ = matches(pattern, key);
    // A key matches itself once every byte is escaped, with or without a
    // leading star, and a lone star matches anything.
    let escaped: Vec<u8> = key.iter().flat_map(|&b| [b'\\', b]).collect();
    assert!(
        matches(&escaped, key),
        "escaped {key:?} does not match itself"
    );
    let starred = [&b"*"[..], &escaped].concat();
    assert!(matches(&starred, key));
    assert!(matches(b"*", key));
});
