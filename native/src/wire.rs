//! The Confluent wire format (magic byte 0, a 4-byte big-endian schema id, the payload) decoded here:
//! JSON Schema payloads with `arrow-json` (the id's Arrow schema), Avro payloads with `arrow-avro` (the
//! id's writer schema resolved to the reader schema); plain Avro (no framing) as one writer schema.
//!
//! Python keeps the registry and the schema evolution (`formats/wire.py`): it tells this side, id by id,
//! how to decode (or which error makes the id's records bad) and the schema every batch is aligned to.
//! A batch with an id this side has not been told about is not decoded here: Python decodes it (fetching
//! the schema) and updates the table, so no record is lost and none changes place.

use std::collections::{BTreeMap, HashMap};
use arrow_array::builder::BinaryBuilder;
use arrow_array::{Array, BinaryArray, RecordBatch, UInt32Array};
use arrow_schema::{ArrowError, SchemaRef};

use crate::align::conform_batch;
use crate::avro::AvroGroup;
use crate::json::{too_long, Decoded, JsonDecoder};

const NOT_WIRE: &str = "not in the Confluent wire format (magic byte 0 and a 4-byte schema id): was it \
                        written without a schema-registry serializer?";

/// How the records of one schema id decode.
pub enum Entry {
    Json(JsonDecoder),
    Avro(AvroGroup),
    /// every record of the id is bad, with this error
    Bad(String),
}

/// The wire format's decoding state.
pub struct Wire {
    /// values start with the magic byte and a schema id (else: all are of id 0)
    pub framed: bool,
    pub target: Option<SchemaRef>,
    pub ids: HashMap<u32, Entry>,
}

impl Wire {
    pub fn new(framed: bool) -> Self {
        Wire { framed, target: None, ids: HashMap::new() }
    }

    /// Decode `values`: None if one has a schema id not in the table (Python decodes the batch then).
    pub fn decode(&mut self, values: &BinaryArray, limit: Option<usize>) -> Result<Option<Decoded>, ArrowError> {
        let Some(target) = self.target.clone() else { return Ok(None) };
        let n = values.len();
        let mut bad: Vec<(i64, String)> = Vec::new();
        let mut tombstones = 0usize;
        let mut groups: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for i in 0..n {
            if values.is_null(i) {
                tombstones += 1;
                continue;
            }
            let v = values.value(i);
            if let Some(max) = limit.filter(|&m| v.len() > m) {
                bad.push((i as i64, too_long(v.len(), max)));
                continue;
            }
            let id = if self.framed {
                if v.len() < 5 || v[0] != 0 {
                    bad.push((i as i64, NOT_WIRE.to_string()));
                    continue;
                }
                u32::from_be_bytes([v[1], v[2], v[3], v[4]])
            } else {
                0
            };
            match self.ids.get(&id) {
                None => return Ok(None),
                Some(Entry::Bad(e)) => bad.push((i as i64, e.clone())),
                Some(_) => groups.entry(id).or_default().push(i),
            }
        }
        let skip = if self.framed { 5 } else { 0 };
        let mut parts: Vec<RecordBatch> = Vec::new();
        let mut rows: Vec<i64> = Vec::new();
        for (id, idx) in &groups {
            let mut b = BinaryBuilder::with_capacity(idx.len(), 0);
            for &i in idx {
                b.append_value(&values.value(i)[skip..]);
            }
            let payloads = b.finish();
            let (batch, good, group_bad): (Option<RecordBatch>, Vec<usize>, Vec<(usize, String)>) =
                match self.ids.get_mut(id).expect("grouped ids are known") {
                    Entry::Json(json) => {
                        let d = json.decode(&payloads, None)?;
                        let good = match d.rows {
                            None => (0..idx.len()).collect(),
                            Some(r) => r.into_iter().map(|i| i as usize).collect(),
                        };
                        (d.batch, good, d.bad.into_iter().map(|(i, e)| (i as usize, e)).collect())
                    }
                    Entry::Avro(avro) => avro.decode(&payloads)?,
                    Entry::Bad(_) => unreachable!("bad ids are not grouped"),
                };
            bad.extend(group_bad.into_iter().map(|(i, e)| (idx[i] as i64, e)));
            if let Some(batch) = batch.filter(|b| b.num_rows() > 0) {
                parts.push(conform_batch(&batch, &target)?);
                rows.extend(good.into_iter().map(|i| idx[i] as i64));
            }
        }
        bad.sort();
        if parts.is_empty() {
            return Ok(Some(Decoded { batch: None, rows: Some(Vec::new()), bad, tombstones }));
        }
        let mut batch = arrow_select::concat::concat_batches(&target, &parts)?;
        if parts.len() > 1 {
            let mut order: Vec<u32> = (0..rows.len() as u32).collect();
            order.sort_by_key(|&k| rows[k as usize]);
            let take = UInt32Array::from(order.clone());
            batch = arrow_select::take::take_record_batch(&batch, &take)?;
            rows = order.into_iter().map(|k| rows[k as usize]).collect();
        }
        let full = rows.len() == n;
        let rows = if full { None } else { Some(rows) };
        Ok(Some(Decoded { batch: Some(batch), rows, bad, tombstones }))
    }
}

/// Fill `wire`'s table: `target` (the schema every batch is aligned to), JSON ids with their Arrow
/// schema, Avro ids with (writer schema, reader schema or None, label), ids whose records are bad.
/// Returns the ids that cannot be decoded here, with why (Python decodes the batches that have them).
pub fn configure(
    wire: &mut Wire,
    target: SchemaRef,
    json: Vec<(u32, SchemaRef)>,
    avro: Vec<(u32, String, Option<String>, String)>,
    bad: Vec<(u32, String)>,
) -> Vec<(u32, String)> {
    let mut refused = Vec::new();
    wire.ids.clear();
    for (id, schema) in json {
        let d = JsonDecoder::new(schema);
        match d.check() {
            Ok(()) => {
                wire.ids.insert(id, Entry::Json(d));
            }
            Err(e) => refused.push((id, e.to_string())),
        }
    }
    for (id, writer, reader, label) in avro {
        match AvroGroup::new(writer, reader, label, &target) {
            Ok(g) => {
                wire.ids.insert(id, Entry::Avro(g));
            }
            Err(why) => refused.push((id, why)),
        }
    }
    for (id, e) in bad {
        wire.ids.insert(id, Entry::Bad(e));
    }
    wire.target = Some(target);
    refused
}
