//! TransportId::decode and FromStr on hostile input: never panic, and accepted values round-trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pr_codec::TransportId;

fuzz_target!(|data: &[u8]| {
    if let Ok((id, used)) = TransportId::decode(data) {
        assert!(used <= data.len());
        let (again, _) = TransportId::decode(&id.encode()).expect("re-encoded TransportID decodes");
        assert_eq!(again, id);
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(id) = text.parse::<TransportId>()
    {
        assert_eq!(id.to_string().parse::<TransportId>(), Ok(id));
    }
});
