//! `Descriptor::parse` on arbitrary bytes: never panics, and whatever it
//! accepts prints to a canonical form that parses back to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_proto::desc::{Descriptor, DESC_LEN_MAX};

fuzz_target!(|data: &[u8]| {
    let Ok(desc) = Descriptor::parse(data) else {
        return;
    };
    let text = desc.to_string();
    // Printing only drops leading zeros, so it never grows past the input.
    assert!(
        text.len() <= data.len() && text.len() <= DESC_LEN_MAX,
        "{text}"
    );
    let again = Descriptor::parse(text.as_bytes())
        .unwrap_or_else(|e| panic!("{text:?} (from {data:?}) does not parse: {e}"));
    assert_eq!(again, desc, "{text:?} parses to another descriptor");
    assert_eq!(text.parse::<Descriptor>().as_ref(), Ok(&desc));
    assert_eq!(again.to_string(), text, "printing is not canonical");
    assert!(desc.end().is_some(), "parsed range overflows: {desc:?}");
});
