//! The node's config loader on arbitrary text: `parse_file` then `validate`
//! never panic; bad input is an error string. What validates must also
//! print (`--print-config`) and list (`CONFIG GET`) without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_server::config::{parse_file, validate};

fuzz_target!(|text: &str| {
    let Ok(raw) = parse_file(text) else {
        return;
    };
    match validate(&raw) {
        Ok(cfg) => {
            let json = serde_json::to_string(&cfg).expect("a valid config serializes");
            assert!(!json.is_empty());
            assert!(cfg.effective_max_value() <= cfg.max_value_size);
            assert!(cfg.max_value_size <= cfg.max_request_size);
            let _ = cfg.entries();
        }
        Err(e) => assert!(!e.is_empty()),
    }
});
