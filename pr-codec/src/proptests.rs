//! Property tests: every encoder/decoder pair round-trips, every decoder survives any bytes.
#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

use proptest::collection::vec;
use proptest::prelude::*;

use super::*;

fn key() -> impl Strategy<Value = Key> {
    any::<u64>().prop_map(Key::new)
}

fn nonzero_key() -> impl Strategy<Value = Key> {
    (1..=u64::MAX).prop_map(Key::new)
}

fn rtype() -> impl Strategy<Value = ReservationType> {
    proptest::sample::select(ReservationType::ALL.to_vec())
}

fn scope() -> impl Strategy<Value = Scope> {
    (0u8..16).prop_map(Scope::from_code)
}

/// Valid TransportIDs of every kind; `Other` only where decoding cannot see a known format.
fn transport_id() -> impl Strategy<Value = TransportId> {
    let fixed_other = (0u8..16, 0u8..4, vec(any::<u8>(), 23))
        .prop_filter("FC/SAS/iSCSI format", |(p, f, _)| {
            !matches!((p, f), (0 | 6, 0)) && *p != 5
        })
        .prop_map(|(protocol_id, format, bytes)| TransportId::Other {
            protocol_id,
            format,
            bytes,
        });
    let iscsi_other = (2u8..4, vec(any::<u8>(), 0..40)).prop_map(|(format, payload)| {
        let mut bytes = vec![0];
        bytes.extend_from_slice(&u16::try_from(payload.len()).unwrap().to_be_bytes());
        bytes.extend(payload);
        TransportId::Other {
            protocol_id: 5,
            format,
            bytes,
        }
    });
    prop_oneof![
        any::<u64>().prop_map(|n_port_name| TransportId::FibreChannel { n_port_name }),
        any::<u64>().prop_map(|address| TransportId::Sas { address }),
        (
            "((iqn|eui|naa)\\.)?[a-zA-Z0-9.:-]{1,100}",
            proptest::option::of("[0-9a-f]{1,12}")
        )
            .prop_map(|(name, isid)| TransportId::Iscsi { name, isid }),
        fixed_other,
        iscsi_other,
    ]
}

fn register_move() -> impl Strategy<Value = RegisterMove> {
    (any::<bool>(), any::<u16>(), transport_id()).prop_map(
        |(unreg, relative_target_port, transport_id)| RegisterMove {
            unreg,
            relative_target_port,
            transport_id,
        },
    )
}

/// Valid requests of every service action, built through the public constructors.
fn pr_out() -> impl Strategy<Value = PrOut> {
    prop_oneof![
        (
            key(),
            key(),
            any::<bool>(),
            any::<bool>(),
            vec(transport_id(), 0..4)
        )
            .prop_map(
                |(old, new, aptpl, all_tg_pt, tids)| PrOut::register(old, new)
                    .with_aptpl(aptpl)
                    .with_all_tg_pt(all_tg_pt)
                    .with_spec_i_pt(tids)
            ),
        (key(), any::<bool>(), any::<bool>()).prop_map(|(new, aptpl, all_tg_pt)| {
            PrOut::register_ignore(new)
                .with_aptpl(aptpl)
                .with_all_tg_pt(all_tg_pt)
        }),
        (key(), rtype()).prop_map(|(k, t)| PrOut::reserve(k, t)),
        (key(), rtype()).prop_map(|(k, t)| PrOut::release(k, t)),
        key().prop_map(PrOut::clear),
        (key(), key(), rtype()).prop_map(|(k, v, t)| PrOut::preempt(k, v, t)),
        (key(), key(), rtype()).prop_map(|(k, v, t)| PrOut::preempt_and_abort(k, v, t)),
        (
            key(),
            nonzero_key(),
            rtype(),
            register_move(),
            any::<bool>()
        )
            .prop_map(|(k, new, t, destination, aptpl)| {
                PrOut::register_and_move(k, new, t, destination).with_aptpl(aptpl)
            }),
    ]
}

fn read_keys() -> impl Strategy<Value = ReadKeys> {
    (any::<u32>(), vec(key(), 0..40)).prop_map(|(generation, keys)| ReadKeys { generation, keys })
}

fn read_reservation() -> impl Strategy<Value = ReadReservation> {
    let reservation =
        (key(), rtype(), scope()).prop_map(|(key, rtype, scope)| Reservation { key, rtype, scope });
    (any::<u32>(), proptest::option::of(reservation)).prop_map(|(generation, reservation)| {
        ReadReservation {
            generation,
            reservation,
        }
    })
}

fn capabilities() -> impl Strategy<Value = Capabilities> {
    (
        any::<[bool; 7]>(),
        0u8..8,
        proptest::sample::subsequence(ReservationType::ALL.to_vec(), 0..=6),
    )
        .prop_map(
            |([rlr_c, crh, sip_c, atp_c, ptpl_c, tmv, ptpl_a], allow_commands, types)| {
                Capabilities {
                    rlr_c,
                    crh,
                    sip_c,
                    atp_c,
                    ptpl_c,
                    tmv,
                    allow_commands,
                    ptpl_a,
                    supported_types: tmv.then_some(types),
                }
            },
        )
}

fn registration() -> impl Strategy<Value = Registration> {
    (
        key(),
        any::<bool>(),
        proptest::option::of((scope(), rtype())),
        any::<u16>(),
        transport_id(),
    )
        .prop_map(
            |(key, all_tg_pt, held, relative_target_port, transport_id)| Registration {
                key,
                all_tg_pt,
                holder: held.is_some(),
                scope: held.map(|(s, _)| s),
                rtype: held.map(|(_, t)| t),
                relative_target_port,
                transport_id,
            },
        )
}

fn full_status() -> impl Strategy<Value = FullStatus> {
    (any::<u32>(), vec(registration(), 0..8)).prop_map(|(generation, registrations)| FullStatus {
        generation,
        registrations,
    })
}

fn nvme_host_id(format: nvme::ReportFormat) -> BoxedStrategy<nvme::HostId> {
    match format {
        nvme::ReportFormat::Extended => any::<[u8; 16]>().prop_map(nvme::HostId::Extended).boxed(),
        nvme::ReportFormat::Basic => any::<u64>().prop_map(nvme::HostId::Basic).boxed(),
    }
}

fn nvme_format() -> impl Strategy<Value = nvme::ReportFormat> {
    proptest::sample::select(vec![
        nvme::ReportFormat::Extended,
        nvme::ReportFormat::Basic,
    ])
}

fn nvme_status() -> impl Strategy<Value = nvme::ReservationStatus> {
    nvme_format().prop_flat_map(|format| {
        let registrant = (any::<u16>(), any::<bool>(), key(), nvme_host_id(format)).prop_map(
            |(cntlid, holder, key, host_id)| nvme::Registrant {
                cntlid,
                holder,
                key,
                host_id,
            },
        );
        (
            any::<u32>(),
            proptest::option::of(rtype()),
            any::<bool>(),
            vec(registrant, 0..20),
        )
            .prop_map(move |(generation, rtype, ptpl, registrants)| {
                nvme::ReservationStatus {
                    format,
                    generation,
                    rtype,
                    ptpl,
                    registrants,
                }
            })
    })
}

/// Every decoder, by name, for the never-panic properties.
fn decode_everything(bytes: &[u8]) {
    let _ = ReadKeys::decode(bytes);
    let _ = ReadReservation::decode(bytes);
    let _ = Capabilities::decode(bytes);
    let _ = FullStatus::decode(bytes);
    let _ = TransportId::decode(bytes);
    let _ = nvme::ReservationStatus::decode(bytes);
    let _ = nvme::ReservationStatus::decode_as(nvme::ReportFormat::Basic, bytes);
    let _ = nvme::ReservationCapabilities::decode_identify(bytes);
    let _ = nvme::required_report_length(bytes);
    let _ = decode_pr_in_cdb(bytes);
    let (cdb, params) = bytes.split_at(bytes.len().min(10));
    let _ = decode_pr_out(cdb, params);
    for action in PrInAction::ALL {
        let _ = required_length(action, bytes);
        let _ = next_allocation_length(action, bytes.len(), bytes);
    }
}

/// Checks a response codec: round trip, trailing bytes ignored, and every proper prefix that
/// holds the length field reports Truncated with the full length.
fn check_response<T: PartialEq + std::fmt::Debug>(
    action: PrInAction,
    value: &T,
    encode: impl Fn(&T) -> Vec<u8>,
    decode: impl Fn(&[u8]) -> Result<T, DecodeError>,
    trailing: &[u8],
    cut: usize,
) -> Result<(), TestCaseError> {
    let bytes = encode(value);
    prop_assert_eq!(&decode(&bytes)?, value);
    prop_assert_eq!(required_length(action, &bytes), Some(bytes.len()));
    let mut longer = bytes.clone();
    longer.extend_from_slice(trailing);
    prop_assert_eq!(&decode(&longer)?, value);
    let cut = cut % bytes.len();
    prop_assert_eq!(
        decode(&bytes[..cut]),
        Err(DecodeError::Truncated {
            needed: if cut < 8 && action != PrInAction::ReportCapabilities {
                8
            } else {
                bytes.len()
            },
            got: cut
        })
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn transport_id_round_trips(id in transport_id(), trailing in vec(any::<u8>(), 0..8)) {
        prop_assert_eq!(id.validate(), Ok(()));
        let mut bytes = id.encode();
        let len = bytes.len();
        bytes.extend(trailing);
        prop_assert_eq!(TransportId::decode(&bytes), Ok((id.clone(), len)));
        prop_assert_eq!(id.to_string().parse::<TransportId>(), Ok(id));
    }

    #[test]
    fn pr_out_round_trips(request in pr_out()) {
        let encoded = request.encode()?;
        prop_assert_eq!(&encoded.cdb[5..9], &u32::try_from(encoded.parameters.len()).unwrap().to_be_bytes());
        prop_assert_eq!(decode_pr_out(&encoded.cdb, &encoded.parameters), Ok(request));
    }

    #[test]
    fn pr_in_cdb_round_trips(index in 0usize..4, allocation_length: u16) {
        let action = PrInAction::ALL[index];
        prop_assert_eq!(decode_pr_in_cdb(&pr_in_cdb(action, allocation_length)), Ok((action, allocation_length)));
    }

    #[test]
    fn read_keys_round_trips(value in read_keys(), trailing in vec(any::<u8>(), 0..16), cut: usize) {
        check_response(PrInAction::ReadKeys, &value, ReadKeys::encode, ReadKeys::decode, &trailing, cut)?;
    }

    #[test]
    fn read_reservation_round_trips(value in read_reservation(), trailing in vec(any::<u8>(), 0..16), cut: usize) {
        check_response(PrInAction::ReadReservation, &value, ReadReservation::encode, ReadReservation::decode, &trailing, cut)?;
    }

    #[test]
    fn capabilities_round_trip(value in capabilities(), trailing in vec(any::<u8>(), 0..16), cut: usize) {
        check_response(PrInAction::ReportCapabilities, &value, Capabilities::encode, Capabilities::decode, &trailing, cut)?;
    }

    #[test]
    fn full_status_round_trips(value in full_status(), trailing in vec(any::<u8>(), 0..16), cut: usize) {
        check_response(PrInAction::ReadFullStatus, &value, FullStatus::encode, FullStatus::decode, &trailing, cut)?;
    }

    #[test]
    fn decoders_never_panic_on_arbitrary_bytes(bytes in vec(any::<u8>(), 0..700)) {
        decode_everything(&bytes);
    }

    /// Random bytes rarely get past the headers; flipping bytes of valid encodings reaches the
    /// descriptor and TransportID paths.
    #[test]
    fn decoders_never_panic_on_mutated_encodings(
        status in full_status(),
        request in pr_out(),
        edits in vec((any::<usize>(), any::<u8>()), 1..6),
    ) {
        let encoded = request.encode()?;
        let mut out_bytes = encoded.cdb.to_vec();
        out_bytes.extend(encoded.parameters);
        for mut bytes in [status.encode(), out_bytes] {
            for (at, value) in &edits {
                let len = bytes.len();
                bytes[at % len] = *value;
            }
            decode_everything(&bytes);
        }
    }

    #[test]
    fn nvme_report_round_trips(value in nvme_status(), trailing in vec(any::<u8>(), 0..80), cut: usize) {
        let format = value.format;
        let bytes = value.encode();
        prop_assert_eq!(format.required_length(&bytes), Some(bytes.len()));
        let mut long = bytes.clone();
        long.extend(trailing);
        prop_assert_eq!(nvme::ReservationStatus::decode_as(format, &long), Ok(value));
        // Every proper prefix is Truncated, with the full length once the count is readable.
        let cut = cut % bytes.len();
        match nvme::ReservationStatus::decode_as(format, &bytes[..cut]) {
            Err(DecodeError::Truncated { needed, got }) => {
                prop_assert_eq!(got, cut);
                prop_assert!(needed == bytes.len() || (cut < 10 && needed == format.length(0)));
            }
            other => prop_assert!(false, "prefix of {} bytes: {:?}", cut, other),
        }
    }

    #[test]
    fn nvme_report_survives_mutation(value in nvme_status(), edits in vec((any::<usize>(), any::<u8>()), 1..6)) {
        let mut bytes = value.encode();
        for (at, byte) in &edits {
            let len = bytes.len();
            bytes[at % len] = *byte;
        }
        decode_everything(&bytes);
    }

    #[test]
    fn nvme_host_ids_round_trip_as_text(host_id in nvme_format().prop_flat_map(nvme_host_id)) {
        let id = TransportId::NvmeHostId { host_id };
        let text = id.to_string();
        // A UUID (36 characters) or 0x and 16 hex digits.
        prop_assert!(text.starts_with("nvme-hostid:") && matches!(text.len() - 12, 36 | 18), "{}", text);
        prop_assert_eq!(text.parse::<TransportId>(), Ok(id.clone()));
        prop_assert!(id.validate().is_err(), "never sent in a SCSI command");
    }
}
