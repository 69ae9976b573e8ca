//! Avro datums of one writer schema into Arrow (`arrow-avro`), resolved to a reader schema, with the
//! bad-record contract of sluice's Avro format: a payload that does not decode, or leaves bytes after
//! its record, is a bad record `(index, error)`, and never fails the batch.
//!
//! The fast path feeds every payload to one decoder; any error sends the batch to the slow path, which
//! tries each payload on a decoder of its own (an error leaves a decoder's builders half-filled) and
//! then decodes the good ones together.

use arrow_array::{Array, BinaryArray, RecordBatch};
use arrow_avro::errors::AvroError;
use arrow_avro::reader::{Decoder, DecoderMode, ReaderBuilder};
use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
use arrow_schema::{ArrowError, SchemaRef};

use crate::align::same_fields;
use crate::avro_check::{Refusal, Shape};

/// What one writer schema's payloads decoded into: the rows (of the decoder's schema), the payload
/// index of each row, and the bad payloads.
pub type Part = (Option<RecordBatch>, Vec<usize>, Vec<(usize, String)>);

/// A decoder (and the cached one) of one writer schema.
pub struct AvroGroup {
    writer: String,
    reader: Option<String>,
    /// "schema id N" or "avro_schema", as the Python decoder names a schema in errors
    label: String,
    cached: Option<Decoder>,
    /// the union check of the writer schema, if it has a union
    shape: Option<Shape>,
}

const CAPACITY: usize = 1 << 30;

impl AvroGroup {
    /// A decoder of `writer` (Avro schema JSON) resolved to `reader` (None: the writer itself), whose
    /// rows must be `target`'s columns (up to [`crate::align::same_values`]); Err: it cannot be decoded
    /// here, with why.
    pub fn new(writer: String, reader: Option<String>, label: String, target: &SchemaRef) -> Result<Self, String> {
        let shape = Shape::parse(&writer).map_err(|e| format!("the union check cannot read the schema: {e}"))?;
        let shape = shape.has_union.then_some(shape);
        let mut g = AvroGroup { writer, reader, label, cached: None, shape };
        let d = g.make().map_err(|e| e.to_string())?;
        let got = d.schema();
        if !same_fields(got.fields(), target.fields()) {
            return Err(format!("arrow-avro decodes it as {got:?}, not as {target:?}"));
        }
        g.cached = Some(d);
        Ok(g)
    }

    fn make(&self) -> Result<Decoder, ArrowError> {
        let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
        store.set(Fingerprint::Id(0), AvroSchema::new(self.writer.clone()))?;
        let mut b = ReaderBuilder::new()
            .with_writer_schema_store(store)
            .with_active_fingerprint(Fingerprint::Id(0))
            .with_decoder_mode(DecoderMode::UnframedDatum)
            .with_batch_size(CAPACITY);
        if let Some(r) = &self.reader {
            b = b.with_reader_schema(AvroSchema::new(r.clone()));
        }
        b.build_decoder()
    }

    fn error(&self, e: &AvroError) -> String {
        match e {
            AvroError::EOF(_) | AvroError::NeedMoreData(_) | AvroError::NeedMoreDataRange(_) => {
                format!("truncated Avro record for {}: its bytes end inside a field ({e})", self.label)
            }
            _ => format!("invalid Avro record for {}: {e}", self.label),
        }
    }

    fn left(&self, n: usize) -> String {
        format!("{n} byte(s) left after the record: not written with {}?", self.label)
    }

    /// Decode `payloads` (none null).
    pub fn decode(&mut self, payloads: &BinaryArray) -> Result<Part, ArrowError> {
        let n = payloads.len();
        let mut d = match self.cached.take() {
            Some(d) => d,
            None => self.make()?,
        };
        let mut whole = true;
        for i in 0..n {
            let v = payloads.value(i);
            if self.shape.as_ref().is_some_and(|s| s.check(v).is_err()) {
                whole = false;
                break;
            }
            match d.decode(v) {
                Ok(used) if used == v.len() => {}
                _ => {
                    whole = false;
                    break;
                }
            }
        }
        if whole {
            if let Ok(batch) = d.flush() {
                let rows = batch.as_ref().map_or(0, |b| b.num_rows());
                if rows == n {
                    self.cached = Some(d);
                    return Ok((batch, (0..n).collect(), Vec::new()));
                }
            }
        }
        self.one_by_one(payloads)
    }

    fn one_by_one(&mut self, payloads: &BinaryArray) -> Result<Part, ArrowError> {
        let mut good = Vec::new();
        let mut bad = Vec::new();
        let mut scratch: Option<Decoder> = None;
        for i in 0..payloads.len() {
            let v = payloads.value(i);
            if let Some(Err(Refusal::Invalid(why))) = self.shape.as_ref().map(|s| s.check(v)) {
                bad.push((i, format!("invalid Avro record for {}: {why}", self.label)));
                continue;
            }
            let mut d = match scratch.take() {
                Some(d) => d,
                None => self.make()?,
            };
            match d.decode(v) {
                Err(e) => bad.push((i, self.error(&e))),
                Ok(used) => match d.flush() {
                    // a string that is not UTF-8 or an enum index out of range shows when the rows are built
                    Err(e) => bad.push((i, self.error(&e))),
                    Ok(_) if used != v.len() => {
                        bad.push((i, self.left(v.len() - used)));
                        scratch = Some(d);
                    }
                    Ok(_) => {
                        good.push(i);
                        scratch = Some(d);
                    }
                },
            }
        }
        if good.is_empty() {
            return Ok((None, good, bad));
        }
        let mut d = self.make()?;
        for &i in &good {
            d.decode(payloads.value(i))?;
        }
        let batch = d.flush()?;
        self.cached = Some(d);
        Ok((batch, good, bad))
    }
}
