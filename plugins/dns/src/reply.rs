//! The reply, read: what a server sent back is checked against the query
//! it answers before any of it is judged, and a refusal says why in a
//! typed [`ReplyError`].

use crate::Plan;
use alloc::format;
use alloc::string::{String, ToString};
use core::fmt;
use hickory_proto::op::{Header, Message, MessageType, Query};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
use hickory_proto::{ProtoError, ProtoErrorKind};

/// The fewest bytes a record takes on the wire: a one-byte name (the root)
/// and the fixed type, class, TTL and length fields.
const MIN_RECORD_BYTES: usize = 11;
/// The fewest bytes a question takes: the root name, type and class.
const MIN_QUESTION_BYTES: usize = 5;
/// A DNS header.
const HEADER_BYTES: usize = 12;

/// Why a reply is not the answer to the query sent.
#[derive(Debug)]
pub(crate) enum ReplyError {
    /// Not even a header could be read.
    Header(ProtoError),
    /// The header claims more questions and records than the bytes hold.
    Overcounted {
        /// The questions claimed.
        questions: u16,
        /// The records claimed, in all three sections.
        records: u32,
        /// The reply's length.
        bytes: usize,
    },
    /// The reply carries another query's ID.
    OtherId {
        /// The reply's ID.
        reply: u16,
        /// The query's.
        query: u16,
    },
    /// The datagram is a query, not a response.
    NotResponse,
    /// The header was fine, the rest is not DNS.
    Malformed(ProtoError),
    /// The reply's question is not the one asked.
    OtherQuestion(Query),
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Header(e) => write!(f, "malformed reply header: {}", proto_reason(e)),
            Self::Overcounted {
                questions,
                records,
                bytes,
            } => write!(
                f,
                "malformed reply: its header claims {questions} question(s) and {records} record(s), \
                 more than its {bytes} bytes can hold"
            ),
            Self::OtherId { reply, query } => write!(f, "reply ID {reply} differs from the query's {query}"),
            Self::NotResponse => f.write_str("the reply is a query, not a response"),
            Self::Malformed(e) => write!(f, "malformed reply: {}", proto_reason(e)),
            Self::OtherQuestion(q) => write!(f, "the reply answers another question ({q})"),
        }
    }
}

/// Parses `bytes` as the reply to a query with `id` for `plan`: refuses,
/// before parsing, counts the bytes cannot hold (so a hostile header costs
/// nothing), then anything that is not the response to this question.
pub(crate) fn parse_reply(bytes: &[u8], id: u16, plan: &Plan) -> Result<Message, ReplyError> {
    let header = Header::read(&mut BinDecoder::new(bytes)).map_err(ReplyError::Header)?;
    let claimed = usize::from(header.query_count()) * MIN_QUESTION_BYTES
        + (usize::from(header.answer_count())
            + usize::from(header.name_server_count())
            + usize::from(header.additional_count()))
            * MIN_RECORD_BYTES;
    if HEADER_BYTES + claimed > bytes.len() {
        return Err(ReplyError::Overcounted {
            questions: header.query_count(),
            records: u32::from(header.answer_count())
                + u32::from(header.name_server_count())
                + u32::from(header.additional_count()),
            bytes: bytes.len(),
        });
    }
    if header.id() != id {
        return Err(ReplyError::OtherId {
            reply: header.id(),
            query: id,
        });
    }
    if header.message_type() != MessageType::Response {
        return Err(ReplyError::NotResponse);
    }
    let m = Message::from_vec(bytes).map_err(ReplyError::Malformed)?;
    // A truncated UDP reply may carry no question; when one is there it
    // must be the one asked.
    if let Some(q) = m.queries().first()
        && (q.query_type() != plan.rtype || q.query_class() != plan.class || !q.name().eq_case(&plan.name))
    {
        return Err(ReplyError::OtherQuestion(q.clone()));
    }
    Ok(m)
}

/// Why hickory-proto refused a reply or a name, in a few words. Its own
/// `Display` formats every kind of error it has, which would put ~60
/// functions in the plugin's function table (past one page: see the tcp
/// plugin's regex features) for messages a malformed reply rarely needs;
/// the kinds a hostile reply produces are told here, the rest by their kind.
pub(crate) fn proto_reason(e: &ProtoError) -> String {
    match e.kind() {
        ProtoErrorKind::Message(m) => (*m).to_string(),
        ProtoErrorKind::Msg(m) => m.clone(),
        ProtoErrorKind::PointerNotPriorToLabel { idx, ptr } => {
            format!("a compression pointer at byte {idx} to byte {ptr}, not before it")
        }
        ProtoErrorKind::LabelBytesTooLong(n) => format!("a label of {n} bytes"),
        ProtoErrorKind::DomainNameTooLong(n) => format!("a name of {n} bytes"),
        ProtoErrorKind::UnrecognizedLabelCode(c) => format!("an unknown label type {c:#x}"),
        ProtoErrorKind::LabelOverlapsWithOther { label, other } => {
            format!("a label at byte {label} overlapping another at {other}")
        }
        _ => "an invalid field".into(),
    }
}
