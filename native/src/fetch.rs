//! One `consume` result as Arrow columns: the messages below their partition's stop offset (key,
//! value, headers, timestamp, partition, offset and a small index naming each message's
//! (topic, partition)), the error and end-of-partition events after them, and the values decoded.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, Int32Builder, Int64Builder, ListBuilder, StringBuilder, StructBuilder,
};
use arrow_array::{Array, ArrayRef, BinaryArray, RecordBatch};
use arrow_schema::{ArrowError, DataType, Field, Fields, Schema};

use crate::client::{self, RawMessage};
use crate::json::{Decoded, JsonDecoder};
use crate::wire::Wire;

/// What a reader needs of its messages.
pub struct Spec {
    pub need_ts: bool,
    pub need_keys: bool,
    pub need_headers: bool,
    /// decode the values natively (json with an explicit schema); None: Python decodes them
    pub json: Option<JsonDecoder>,
    /// decode the values in the schema registry's wire format (or plain Avro) natively
    pub wire: Option<Wire>,
    pub max_record_bytes: Option<usize>,
}

/// An error or end-of-partition event (`topic` None: not about a partition).
pub struct Event {
    pub code: i32,
    pub topic: Option<String>,
    pub partition: i32,
    pub offset: i64,
    pub text: String,
}

/// One `consume` result.
pub struct Fetched {
    /// columns tp, partition, offset, value [, timestamp] [, key] [, headers]
    pub fields: RecordBatch,
    /// (topic, partition) of each tp index
    pub tps: Vec<(String, i32)>,
    /// tp indices of partitions that delivered a message at or past their stop offset
    pub passed_end: Vec<i32>,
    pub nbytes: usize,
    pub events: Vec<Event>,
    pub decoded: Option<Decoded>,
}

fn header_fields() -> Fields {
    Fields::from(vec![Field::new("key", DataType::Utf8, true), Field::new("value", DataType::Binary, true)])
}

struct Columns {
    tp: Int32Builder,
    partition: Int32Builder,
    offset: Int64Builder,
    value: BinaryBuilder,
    timestamp: Option<Int64Builder>,
    key: Option<BinaryBuilder>,
    headers: Option<ListBuilder<StructBuilder>>,
}

impl Columns {
    fn new(spec: &Spec, n: usize) -> Self {
        Columns {
            tp: Int32Builder::with_capacity(n),
            partition: Int32Builder::with_capacity(n),
            offset: Int64Builder::with_capacity(n),
            value: BinaryBuilder::with_capacity(n, n * 128),
            timestamp: spec.need_ts.then(|| Int64Builder::with_capacity(n)),
            key: spec.need_keys.then(|| BinaryBuilder::with_capacity(n, n * 16)),
            headers: spec.need_headers.then(|| ListBuilder::new(StructBuilder::from_fields(header_fields(), 0))),
        }
    }

    unsafe fn push(&mut self, p: *mut RawMessage, tp: i32) -> usize {
        let m = &*p;
        self.tp.append_value(tp);
        self.partition.append_value(m.partition);
        self.offset.append_value(m.offset);
        let size = if m.payload.is_null() {
            self.value.append_null();
            0
        } else {
            self.value.append_value(std::slice::from_raw_parts(m.payload as *const u8, m.len));
            m.len
        };
        if let Some(ts) = self.timestamp.as_mut() {
            ts.append_value(client::timestamp(p));
        }
        if let Some(k) = self.key.as_mut() {
            if m.key.is_null() {
                k.append_null();
            } else {
                k.append_value(std::slice::from_raw_parts(m.key as *const u8, m.key_len));
            }
        }
        if let Some(h) = self.headers.as_mut() {
            match client::headers(p) {
                None => h.append(false),
                Some(pairs) => {
                    for (name, value) in pairs {
                        let s = h.values();
                        s.field_builder::<StringBuilder>(0).expect("key").append_value(name);
                        let vb = s.field_builder::<BinaryBuilder>(1).expect("value");
                        match value {
                            Some(v) => vb.append_value(v),
                            None => vb.append_null(),
                        }
                        s.append(true);
                    }
                    h.append(true);
                }
            }
        }
        size
    }

    fn finish(mut self) -> Result<(RecordBatch, BinaryArray), ArrowError> {
        let value = self.value.finish();
        let mut fields = vec![
            Field::new("tp", DataType::Int32, false),
            Field::new("partition", DataType::Int32, false),
            Field::new("offset", DataType::Int64, false),
            Field::new("value", DataType::Binary, true),
        ];
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(self.tp.finish()),
            Arc::new(self.partition.finish()),
            Arc::new(self.offset.finish()),
            Arc::new(value.clone()),
        ];
        if let Some(mut ts) = self.timestamp {
            fields.push(Field::new("timestamp", DataType::Int64, false));
            cols.push(Arc::new(ts.finish()));
        }
        if let Some(mut k) = self.key {
            fields.push(Field::new("key", DataType::Binary, true));
            cols.push(Arc::new(k.finish()));
        }
        if let Some(mut h) = self.headers {
            let arr = h.finish();
            fields.push(Field::new("headers", arr.data_type().clone(), true));
            cols.push(Arc::new(arr));
        }
        Ok((RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?, value))
    }
}

/// The state a reader keeps between batches: its stop offsets and the names of the topics it met.
#[derive(Default)]
pub struct Positions {
    /// (topic, partition) -> stop offset (exclusive), for bounded splits
    pub ends: HashMap<(String, i32), i64>,
    topics: HashMap<usize, String>,
}

impl Positions {
    fn topic(&mut self, rkt: *mut rdkafka_sys::rd_kafka_topic_t) -> String {
        self.topics.entry(rkt as usize).or_insert_with(|| client::topic_name(rkt)).clone()
    }
}

fn event(m: &RawMessage, pos: &mut Positions) -> Event {
    let text = if m.payload.is_null() {
        client::error_text(m.err)
    } else {
        let bytes = unsafe { std::slice::from_raw_parts(m.payload as *const u8, m.len) };
        String::from_utf8_lossy(bytes).into_owned()
    };
    let topic = (!m.rkt.is_null()).then(|| pos.topic(m.rkt));
    Event { code: m.err, topic, partition: m.partition, offset: m.offset, text }
}

/// Turn `msgs` (from [`client::Client::consume`]) into a [`Fetched`], decoding the values if `spec` says
/// so. The messages are not freed here.
pub fn build(msgs: &[*mut RawMessage], spec: &mut Spec, pos: &mut Positions) -> Result<Fetched, ArrowError> {
    let mut cols = Columns::new(spec, msgs.len());
    let mut events = Vec::new();
    let mut tps: Vec<(String, i32)> = Vec::new();
    let mut tp_of: HashMap<(usize, i32), (i32, Option<i64>)> = HashMap::new();
    let mut last: Option<((usize, i32), (i32, Option<i64>))> = None;
    let mut passed_end: HashSet<i32> = HashSet::new();
    let mut nbytes = 0usize;
    for &p in msgs {
        let m = unsafe { &*p };
        if m.err != 0 {
            events.push(event(m, pos));
            continue;
        }
        let key = (m.rkt as usize, m.partition);
        let (tp, end) = match last {
            Some((k, v)) if k == key => v,
            _ => {
                let v = match tp_of.get(&key) {
                    Some(v) => *v,
                    None => {
                        let topic = pos.topic(m.rkt);
                        let end = pos.ends.get(&(topic.clone(), m.partition)).copied();
                        let v = (tps.len() as i32, end);
                        tps.push((topic, m.partition));
                        tp_of.insert(key, v);
                        v
                    }
                };
                last = Some((key, v));
                v
            }
        };
        if let Some(end) = end {
            if m.offset >= end {
                passed_end.insert(tp);
                continue;
            }
        }
        nbytes += unsafe { cols.push(p, tp) };
    }
    let (fields, values) = cols.finish()?;
    let decoded = match (&spec.json, spec.wire.as_mut()) {
        _ if fields.num_rows() == 0 => None,
        (Some(json), _) => Some(json.decode(&values, spec.max_record_bytes)?),
        (None, Some(wire)) => wire.decode(&values, spec.max_record_bytes)?,
        (None, None) => None,
    };
    let mut passed: Vec<i32> = passed_end.into_iter().collect();
    passed.sort_unstable();
    Ok(Fetched { fields, tps, passed_end: passed, nbytes, events, decoded })
}
