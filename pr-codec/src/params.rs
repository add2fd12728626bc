//! PERSISTENT RESERVE OUT requests: the CDB plus the parameter list (SPC-4 6.16.3).

use super::cdb::{PR_OUT_OPCODE, PrOutAction, pr_out_cdb};
use super::error::{DecodeError, EncodeError};
use super::key::Key;
use super::transport_id::TransportId;
use super::types::{ReservationType, Scope};
use super::wire;

/// Length of the basic parameter list (and of the REGISTER AND MOVE header).
pub const PR_OUT_BASIC_LEN: usize = 24;
const SPEC_I_PT: u8 = 0x08;
const ALL_TG_PT: u8 = 0x04;
const APTPL: u8 = 0x01;
const MOVE_UNREG: u8 = 0x02;
const MOVE_APTPL: u8 = 0x01;

/// One PERSISTENT RESERVE OUT request. Prefer the constructors: they set only the fields the
/// service action uses, and [`PrOut::encode`] rejects anything else.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PrOut {
    pub action: PrOutAction,
    pub rtype: Option<ReservationType>,
    /// RESERVATION KEY: the caller's current key.
    pub key: Key,
    /// SERVICE ACTION RESERVATION KEY: the new key (REGISTER*), the victim (PREEMPT*), or the
    /// key registered for the destination (REGISTER AND MOVE).
    pub sa_key: Key,
    pub aptpl: bool,
    pub all_tg_pt: bool,
    /// SPEC_I_PT TransportIDs (REGISTER only); empty means SPEC_I_PT=0.
    pub spec_i_pt: Vec<TransportId>,
    pub register_move: Option<RegisterMove>,
}

/// The REGISTER AND MOVE destination.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RegisterMove {
    /// Unregister the source I_T nexus after the move.
    pub unreg: bool,
    pub relative_target_port: u16,
    pub transport_id: TransportId,
}

/// A PERSISTENT RESERVE OUT command ready for the transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub cdb: [u8; 10],
    pub parameters: Vec<u8>,
}

impl PrOut {
    fn new(action: PrOutAction, key: Key, sa_key: Key, rtype: Option<ReservationType>) -> Self {
        PrOut {
            action,
            rtype,
            key,
            sa_key,
            aptpl: false,
            all_tg_pt: false,
            spec_i_pt: Vec::new(),
            register_move: None,
        }
    }

    /// REGISTER: `old` is the current key (zero if unregistered), `new` the key to hold
    /// (zero unregisters).
    pub fn register(old: Key, new: Key) -> Self {
        Self::new(PrOutAction::Register, old, new, None)
    }

    /// REGISTER with a zero new key.
    pub fn unregister(key: Key) -> Self {
        Self::register(key, Key::ZERO)
    }

    /// REGISTER AND IGNORE EXISTING KEY.
    pub fn register_ignore(new: Key) -> Self {
        Self::new(
            PrOutAction::RegisterAndIgnoreExistingKey,
            Key::ZERO,
            new,
            None,
        )
    }

    pub fn reserve(key: Key, rtype: ReservationType) -> Self {
        Self::new(PrOutAction::Reserve, key, Key::ZERO, Some(rtype))
    }

    pub fn release(key: Key, rtype: ReservationType) -> Self {
        Self::new(PrOutAction::Release, key, Key::ZERO, Some(rtype))
    }

    pub fn clear(key: Key) -> Self {
        Self::new(PrOutAction::Clear, key, Key::ZERO, None)
    }

    /// PREEMPT the registrations of `victim`; `rtype` is the type to hold afterwards if the
    /// victim held the reservation.
    pub fn preempt(key: Key, victim: Key, rtype: ReservationType) -> Self {
        Self::new(PrOutAction::Preempt, key, victim, Some(rtype))
    }

    pub fn preempt_and_abort(key: Key, victim: Key, rtype: ReservationType) -> Self {
        Self::new(PrOutAction::PreemptAndAbort, key, victim, Some(rtype))
    }

    pub fn register_and_move(
        key: Key,
        new_holder_key: Key,
        rtype: ReservationType,
        destination: RegisterMove,
    ) -> Self {
        PrOut {
            register_move: Some(destination),
            ..Self::new(
                PrOutAction::RegisterAndMove,
                key,
                new_holder_key,
                Some(rtype),
            )
        }
    }

    pub fn with_aptpl(self, aptpl: bool) -> Self {
        PrOut { aptpl, ..self }
    }

    pub fn with_all_tg_pt(self, all_tg_pt: bool) -> Self {
        PrOut { all_tg_pt, ..self }
    }

    pub fn with_spec_i_pt(self, spec_i_pt: Vec<TransportId>) -> Self {
        PrOut { spec_i_pt, ..self }
    }

    /// Rejects fields SPC ignores or forbids for this service action: setting them means the
    /// caller misunderstood what will happen.
    fn validate(&self) -> Result<(), EncodeError> {
        use PrOutAction as A;
        let action = self.action.name();
        let not_allowed = |field| Err(EncodeError::FieldNotAllowed { action, field });
        let takes_type = !matches!(
            self.action,
            A::Register | A::RegisterAndIgnoreExistingKey | A::Clear
        );
        match (takes_type, self.rtype) {
            (true, None) => return Err(EncodeError::MissingType { action }),
            (false, Some(_)) => return not_allowed("TYPE"),
            _ => {}
        }
        if self.action == A::RegisterAndIgnoreExistingKey && !self.key.is_zero() {
            return not_allowed("RESERVATION KEY");
        }
        if matches!(self.action, A::Reserve | A::Release | A::Clear) && !self.sa_key.is_zero() {
            return not_allowed("SERVICE ACTION RESERVATION KEY");
        }
        let registers = matches!(self.action, A::Register | A::RegisterAndIgnoreExistingKey);
        if self.aptpl && !(registers || self.action == A::RegisterAndMove) {
            return not_allowed("APTPL");
        }
        if self.all_tg_pt && !registers {
            return not_allowed("ALL_TG_PT");
        }
        if !self.spec_i_pt.is_empty() && self.action != A::Register {
            return not_allowed("SPEC_I_PT");
        }
        match (self.action == A::RegisterAndMove, &self.register_move) {
            (true, None) => return Err(EncodeError::MissingRegisterMove),
            (false, Some(_)) => return not_allowed("REGISTER AND MOVE parameters"),
            (true, Some(destination)) => {
                if self.sa_key.is_zero() {
                    return Err(EncodeError::ZeroServiceActionKey { action });
                }
                destination.transport_id.validate()?;
            }
            (false, None) => {}
        }
        self.spec_i_pt
            .iter()
            .try_for_each(TransportId::validate)
            .map_err(EncodeError::from)
    }

    /// The CDB and parameter list, after checking the request makes sense for its action.
    pub fn encode(&self) -> Result<Encoded, EncodeError> {
        self.validate()?;
        let mut parameters = Vec::with_capacity(PR_OUT_BASIC_LEN);
        parameters.extend_from_slice(&self.key.to_be_bytes());
        parameters.extend_from_slice(&self.sa_key.to_be_bytes());
        if let Some(destination) = &self.register_move {
            let transport_id = destination.transport_id.encode();
            let flags = if destination.unreg { MOVE_UNREG } else { 0 }
                | if self.aptpl { MOVE_APTPL } else { 0 };
            parameters.extend_from_slice(&[0, flags]);
            parameters.extend_from_slice(&destination.relative_target_port.to_be_bytes());
            parameters.extend_from_slice(&self.length_field(transport_id.len())?.to_be_bytes());
            parameters.extend_from_slice(&transport_id);
        } else {
            let flags = if self.spec_i_pt.is_empty() {
                0
            } else {
                SPEC_I_PT
            } | if self.all_tg_pt { ALL_TG_PT } else { 0 }
                | if self.aptpl { APTPL } else { 0 };
            parameters.extend_from_slice(&[0, 0, 0, 0, flags, 0, 0, 0]);
            if !self.spec_i_pt.is_empty() {
                let transport_ids: Vec<u8> =
                    self.spec_i_pt.iter().flat_map(|t| t.encode()).collect();
                parameters
                    .extend_from_slice(&self.length_field(transport_ids.len())?.to_be_bytes());
                parameters.extend_from_slice(&transport_ids);
            }
        }
        let parameter_list_length = self.length_field(parameters.len())?;
        Ok(Encoded {
            cdb: pr_out_cdb(self.action, self.rtype, parameter_list_length),
            parameters,
        })
    }

    fn length_field(&self, len: usize) -> Result<u32, EncodeError> {
        u32::try_from(len).map_err(|_| EncodeError::TooLong {
            action: self.action.name(),
            len,
        })
    }
}

const WHAT: &str = "PERSISTENT RESERVE OUT parameter list";

/// Parses a PERSISTENT RESERVE OUT command as a target would (for property tests and the fake
/// target). Fields the action ignores are reported as sent, so `sg_persist`-style requests
/// with a TYPE on REGISTER decode even though [`PrOut::encode`] would refuse them.
pub fn decode_pr_out(cdb: &[u8], params: &[u8]) -> Result<PrOut, DecodeError> {
    let (Some(opcode), Some(service_action), Some(scope_type), Some(list_len)) = (
        wire::u8_at(cdb, 0),
        wire::u8_at(cdb, 1),
        wire::u8_at(cdb, 2),
        wire::be32(cdb, 5),
    ) else {
        return Err(DecodeError::Truncated {
            needed: 10,
            got: cdb.len(),
        });
    };
    if opcode != PR_OUT_OPCODE {
        return Err(DecodeError::malformed(
            "PERSISTENT RESERVE OUT CDB",
            format!("opcode {opcode:#04x}, expected 0x5f"),
        ));
    }
    let code = service_action & 0x1f;
    let action = PrOutAction::from_code(code).ok_or(DecodeError::UnknownServiceAction {
        what: "PERSISTENT RESERVE OUT",
        code,
    })?;
    let scope = Scope::from_code(scope_type >> 4);
    if scope != Scope::LogicalUnit {
        return Err(DecodeError::malformed(
            "PERSISTENT RESERVE OUT CDB",
            format!("SCOPE {scope}, only LU_SCOPE exists"),
        ));
    }
    let rtype = match scope_type & 0x0f {
        0 => None,
        code => Some(
            ReservationType::from_code(code).ok_or(DecodeError::UnknownType {
                what: "PERSISTENT RESERVE OUT CDB",
                code,
            })?,
        ),
    };
    let list_len = wire::len32(list_len);
    let list = params.get(..list_len).ok_or(DecodeError::Truncated {
        needed: list_len,
        got: params.len(),
    })?;
    let (Some(key), Some(sa_key), true) = (
        wire::be64(list, 0),
        wire::be64(list, 8),
        list_len >= PR_OUT_BASIC_LEN,
    ) else {
        return Err(DecodeError::malformed(
            WHAT,
            format!("PARAMETER LIST LENGTH {list_len}, at least 24 required"),
        ));
    };
    let mut request = PrOut {
        rtype,
        ..PrOut::new(action, Key::new(key), Key::new(sa_key), None)
    };
    if action == PrOutAction::RegisterAndMove {
        let (Some(flags), Some(relative_target_port), Some(tid_len)) = (
            wire::u8_at(list, 17),
            wire::be16(list, 18),
            wire::be32(list, 20),
        ) else {
            return Err(DecodeError::malformed(
                WHAT,
                "REGISTER AND MOVE header cut short",
            ));
        };
        let tids = transport_id_region(list, 20, tid_len)?;
        let (transport_id, used) = decode_transport_id(tids)?;
        if used != tids.len() {
            return Err(DecodeError::malformed(
                WHAT,
                format!(
                    "TRANSPORTID PARAMETER DATA LENGTH {} but the TransportID uses {used}",
                    tids.len()
                ),
            ));
        }
        request.aptpl = flags & MOVE_APTPL != 0;
        request.register_move = Some(RegisterMove {
            unreg: flags & MOVE_UNREG != 0,
            relative_target_port,
            transport_id,
        });
        return Ok(request);
    }
    let flags = wire::u8_at(list, 20).unwrap_or(0);
    request.aptpl = flags & APTPL != 0;
    request.all_tg_pt = flags & ALL_TG_PT != 0;
    if flags & SPEC_I_PT == 0 {
        if list_len != PR_OUT_BASIC_LEN {
            return Err(DecodeError::malformed(
                WHAT,
                format!("PARAMETER LIST LENGTH {list_len} without SPEC_I_PT, 24 expected"),
            ));
        }
        return Ok(request);
    }
    let tid_len = wire::be32(list, 24).ok_or_else(|| {
        DecodeError::malformed(
            WHAT,
            "SPEC_I_PT set but no TRANSPORTID PARAMETER DATA LENGTH",
        )
    })?;
    let mut rest = transport_id_region(list, 24, tid_len)?;
    while !rest.is_empty() {
        let (transport_id, used) = decode_transport_id(rest)?;
        request.spec_i_pt.push(transport_id);
        rest = rest.get(used..).unwrap_or_default();
    }
    Ok(request)
}

/// A TransportID inside a region whose length was already checked: running past it is a
/// malformed list, not a truncated one.
fn decode_transport_id(region: &[u8]) -> Result<(TransportId, usize), DecodeError> {
    TransportId::decode(region)
        .map_err(|err| DecodeError::malformed(WHAT, format!("TransportID: {err}")))
}

/// The TransportIDs after the 4-byte TRANSPORTID PARAMETER DATA LENGTH at `length_at`, which
/// must end exactly where the parameter list does (SPC: PARAMETER LIST LENGTH ERROR otherwise).
fn transport_id_region(list: &[u8], length_at: usize, tid_len: u32) -> Result<&[u8], DecodeError> {
    let start = length_at.saturating_add(4);
    let region = list.get(start..).unwrap_or_default();
    if region.len() != wire::len32(tid_len) {
        return Err(DecodeError::malformed(
            WHAT,
            format!(
                "TRANSPORTID PARAMETER DATA LENGTH {tid_len} but {} bytes follow it",
                region.len()
            ),
        ));
    }
    Ok(region)
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;
    use ReservationType as T;

    fn key(value: u64) -> Key {
        Key::new(value)
    }

    #[test]
    fn preempt_and_abort_matches_fence_scsi_bytes() {
        // fence_scsi off: sg_persist -n -o -A -T 5 -K 0x1 -S 0x2
        let encoded = PrOut::preempt_and_abort(key(1), key(2), T::WriteExclusiveRegistrantsOnly)
            .encode()
            .unwrap();
        assert_eq!(encoded.cdb, [0x5f, 5, 5, 0, 0, 0, 0, 0, 24, 0]);
        let mut expected = [0u8; 24];
        expected[7] = 1;
        expected[15] = 2;
        assert_eq!(encoded.parameters, expected);
    }

    #[test]
    fn register_ignore_with_aptpl_sets_byte_20() {
        let encoded = PrOut::register_ignore(key(0xabc))
            .with_aptpl(true)
            .with_all_tg_pt(true)
            .encode()
            .unwrap();
        assert_eq!(encoded.cdb[1], 6);
        assert_eq!(encoded.cdb[2], 0);
        assert_eq!(encoded.parameters[20], 0x05);
        assert_eq!(&encoded.parameters[8..16], &0xabcu64.to_be_bytes());
    }

    #[test]
    fn spec_i_pt_appends_transport_ids_with_their_length() {
        let tid = TransportId::FibreChannel { n_port_name: 7 };
        let encoded = PrOut::register(Key::ZERO, key(9))
            .with_spec_i_pt(vec![tid.clone(), tid.clone()])
            .encode()
            .unwrap();
        assert_eq!(encoded.parameters.len(), 28 + 48);
        assert_eq!(encoded.parameters[20], SPEC_I_PT);
        assert_eq!(&encoded.parameters[24..28], &[0, 0, 0, 48]);
        assert_eq!(&encoded.cdb[5..9], &[0, 0, 0, 76]);
        let decoded = decode_pr_out(&encoded.cdb, &encoded.parameters).unwrap();
        assert_eq!(decoded.spec_i_pt, vec![tid.clone(), tid]);
    }

    #[test]
    fn register_and_move_layout() {
        let destination = RegisterMove {
            unreg: true,
            relative_target_port: 0x0102,
            transport_id: "iqn.2026-11.lab:nodeb".parse().unwrap(),
        };
        let request = PrOut::register_and_move(key(1), key(2), T::WriteExclusive, destination)
            .with_aptpl(true);
        let encoded = request.encode().unwrap();
        assert_eq!(encoded.cdb[1..3], [7, 1]);
        assert_eq!(encoded.parameters[17], 0x03);
        assert_eq!(&encoded.parameters[18..20], &[1, 2]);
        assert_eq!(&encoded.parameters[20..24], &[0, 0, 0, 28]);
        assert_eq!(encoded.parameters.len(), 52);
        assert_eq!(
            decode_pr_out(&encoded.cdb, &encoded.parameters),
            Ok(request)
        );
    }

    #[test]
    fn encode_rejects_fields_the_action_does_not_use() {
        let fc = TransportId::FibreChannel { n_port_name: 1 };
        let cases = [
            (
                PrOut::reserve(key(1), T::WriteExclusive).with_aptpl(true),
                "APTPL",
            ),
            (
                PrOut::preempt(key(1), key(2), T::WriteExclusive).with_all_tg_pt(true),
                "ALL_TG_PT",
            ),
            (
                PrOut::register_ignore(key(1)).with_spec_i_pt(vec![fc]),
                "SPEC_I_PT",
            ),
            (
                PrOut {
                    rtype: Some(T::WriteExclusive),
                    ..PrOut::clear(key(1))
                },
                "TYPE",
            ),
            (
                PrOut {
                    key: key(5),
                    ..PrOut::register_ignore(key(1))
                },
                "RESERVATION KEY",
            ),
            (
                PrOut {
                    sa_key: key(5),
                    ..PrOut::release(key(1), T::WriteExclusive)
                },
                "SERVICE ACTION RESERVATION KEY",
            ),
        ];
        for (request, field) in cases {
            assert_eq!(
                request.encode(),
                Err(EncodeError::FieldNotAllowed {
                    action: request.action.name(),
                    field
                })
            );
        }
        assert_eq!(
            PrOut {
                rtype: None,
                ..PrOut::reserve(key(1), T::WriteExclusive)
            }
            .encode(),
            Err(EncodeError::MissingType { action: "RESERVE" })
        );
        let destination = RegisterMove {
            unreg: false,
            relative_target_port: 1,
            transport_id: TransportId::Sas { address: 1 },
        };
        assert_eq!(
            PrOut::register_and_move(key(1), Key::ZERO, T::WriteExclusive, destination).encode(),
            Err(EncodeError::ZeroServiceActionKey {
                action: "REGISTER AND MOVE"
            })
        );
        let bad_name = TransportId::Iscsi {
            name: String::new(),
            isid: None,
        };
        assert!(matches!(
            PrOut::register(Key::ZERO, key(1))
                .with_spec_i_pt(vec![bad_name])
                .encode(),
            Err(EncodeError::TransportId(_))
        ));
    }

    #[test]
    fn decode_accepts_type_on_register_like_sg_persist_sends() {
        let mut cdb = pr_out_cdb(PrOutAction::Register, None, 24);
        cdb[2] = 5;
        let decoded = decode_pr_out(&cdb, &[0; 24]).unwrap();
        assert_eq!(decoded.rtype, Some(T::WriteExclusiveRegistrantsOnly));
    }

    #[test]
    fn decode_rejects_bad_lengths_scope_and_type() {
        let cdb = pr_out_cdb(PrOutAction::Clear, None, 24);
        assert_eq!(
            decode_pr_out(&cdb, &[0; 20]),
            Err(DecodeError::Truncated {
                needed: 24,
                got: 20
            })
        );
        let short = pr_out_cdb(PrOutAction::Clear, None, 16);
        assert!(matches!(
            decode_pr_out(&short, &[0; 16]),
            Err(DecodeError::Malformed { .. })
        ));
        let long = pr_out_cdb(PrOutAction::Clear, None, 28);
        assert!(matches!(
            decode_pr_out(&long, &[0; 28]),
            Err(DecodeError::Malformed { .. })
        ));
        let mut scoped = cdb;
        scoped[2] = 0x11;
        assert!(matches!(
            decode_pr_out(&scoped, &[0; 24]),
            Err(DecodeError::Malformed { .. })
        ));
        let mut typed = cdb;
        typed[2] = 2;
        assert_eq!(
            decode_pr_out(&typed, &[0; 24]),
            Err(DecodeError::UnknownType {
                what: "PERSISTENT RESERVE OUT CDB",
                code: 2
            })
        );
        let mut replace_lost = cdb;
        replace_lost[1] = 8;
        assert!(matches!(
            decode_pr_out(&replace_lost, &[0; 24]),
            Err(DecodeError::UnknownServiceAction { code: 8, .. })
        ));
        // SPEC_I_PT whose length says more than follows.
        let cdb = pr_out_cdb(PrOutAction::Register, None, 28);
        let mut params = [0u8; 28];
        params[20] = SPEC_I_PT;
        params[27] = 24;
        assert!(matches!(
            decode_pr_out(&cdb, &params),
            Err(DecodeError::Malformed { .. })
        ));
        // REGISTER AND MOVE without a TransportID.
        let cdb = pr_out_cdb(PrOutAction::RegisterAndMove, Some(T::WriteExclusive), 24);
        assert!(matches!(
            decode_pr_out(&cdb, &[0; 24]),
            Err(DecodeError::Malformed { .. })
        ));
    }
}
