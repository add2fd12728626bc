//! decode_pr_out (what a target parses): never panics; requests that also encode round-trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pr_codec::decode_pr_out;

fuzz_target!(|data: &[u8]| {
    let (cdb, params) = data.split_at(data.len().min(10));
    if let Ok(request) = decode_pr_out(cdb, params)
        && let Ok(encoded) = request.encode()
    {
        assert_eq!(
            decode_pr_out(&encoded.cdb, &encoded.parameters),
            Ok(request)
        );
    }
});
