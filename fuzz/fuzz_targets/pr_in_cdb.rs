//! decode_pr_in_cdb: never panics, and accepted CDBs re-encode to the same action and length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pr_codec::{decode_pr_in_cdb, pr_in_cdb};

fuzz_target!(|data: &[u8]| {
    if let Ok((action, allocation_length)) = decode_pr_in_cdb(data) {
        assert_eq!(
            decode_pr_in_cdb(&pr_in_cdb(action, allocation_length)),
            Ok((action, allocation_length))
        );
    }
});
