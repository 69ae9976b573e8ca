//! JSON values into an Arrow record batch of a given schema (`arrow-json`), with the bad-record contract of
//! sluice's formats: every value is one row, a tombstone (null value, skipped and counted) or a bad
//! record `(index, error)`; a bad record never fails the batch.
//!
//! The fast path feeds each value to one decoder and checks after each that it made exactly one whole
//! row; any surprise (a parse or type error, a value that is not one object) sends the batch to the slow
//! path, which decodes each value alone to find the bad ones (rare: bad records are the exception).

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BinaryArray, RecordBatch};
use arrow_json::reader::{ArrayDecoder, Decoder, DecoderContext, DecoderFactory, ReaderBuilder, Tape, TapeElement};
use arrow_schema::{ArrowError, DataType, FieldRef, SchemaRef};

/// The decoding of a batch of values (indices refer to the values).
pub struct Decoded {
    pub batch: Option<RecordBatch>,
    /// the value index of each row; None: one row per value, in order
    pub rows: Option<Vec<i64>>,
    pub bad: Vec<(i64, String)>,
    pub tombstones: usize,
}

/// The text a value over `max_record_bytes` is a bad record with (the Python decoders' text).
pub fn too_long(n: usize, limit: usize) -> String {
    format!(
        "the value is {n} bytes, over max_record_bytes ({limit}): raise the KafkaSource option \
         max_record_bytes (and the brokers' message.max.bytes) to read it"
    )
}

fn error_text(e: &ArrowError) -> String {
    // the shape pyarrow's errors have in dead letters ("ArrowInvalid: JSON parse error: ...")
    let text = match e {
        ArrowError::JsonError(t) | ArrowError::ParseError(t) | ArrowError::InvalidArgumentError(t) => t.clone(),
        other => other.to_string(),
    };
    format!("ArrowInvalid: JSON parse error: {text}")
}

/// The one JSON kind each primitive column takes, as `pyarrow.json` (today's reader) has it: arrow-json
/// on its own would also read `"7"` or `1.5` into an integer column (as 7 and 1) or a number into a
/// timestamp; such values are bad records in both readers.
#[derive(Clone, Copy)]
enum Kind {
    /// an integer literal (no fraction, no exponent)
    Integer,
    /// any number
    Number,
    /// a string
    Text,
    /// true or false
    Boolean,
}

impl Kind {
    fn of(t: &DataType) -> Option<(Kind, &'static str)> {
        use DataType::*;
        Some(match t {
            Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Date32 => (Kind::Integer, "an integer"),
            Float16 | Float32 | Float64 => (Kind::Number, "a number"),
            Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView | Timestamp(_, _) => (Kind::Text, "a string"),
            Boolean => (Kind::Boolean, "true or false"),
            _ => return None,
        })
    }

    fn accepts(self, tape: &Tape<'_>, e: TapeElement) -> bool {
        match (self, e) {
            (_, TapeElement::Null) => true,
            (Kind::Integer, TapeElement::Number(idx)) => !tape.get_string(idx).bytes().any(|c| matches!(c, b'.' | b'e' | b'E')),
            (Kind::Number, TapeElement::Number(_)) => true,
            (Kind::Text, TapeElement::String(_)) => true,
            (Kind::Boolean, TapeElement::True | TapeElement::False) => true,
            _ => false,
        }
    }
}

/// The builtin decoder of a column, after a check that every value is of the column's [`Kind`].
struct Strict {
    inner: Box<dyn ArrayDecoder>,
    kind: Kind,
    what: &'static str,
}

impl ArrayDecoder for Strict {
    fn decode(&mut self, tape: &Tape<'_>, pos: &[u32]) -> Result<ArrayRef, ArrowError> {
        for &p in pos {
            if !self.kind.accepts(tape, tape.get(p)) {
                return Err(tape.error(p, self.what));
            }
        }
        self.inner.decode(tape, pos)
    }
}

#[derive(Debug)]
struct StrictFactory;

impl DecoderFactory for StrictFactory {
    fn make_default_decoder(
        &self,
        ctx: &DecoderContext,
        field: &FieldRef,
        is_nullable: bool,
    ) -> Result<Option<Box<dyn ArrayDecoder>>, ArrowError> {
        match Kind::of(field.data_type()) {
            None => Ok(None),
            Some((kind, what)) => {
                let inner = ctx.make_builtin_decoder(field, is_nullable)?;
                Ok(Some(Box::new(Strict { inner, kind, what })))
            }
        }
    }
}

/// Decodes JSON objects into batches of `schema` (unknown fields ignored, missing ones null).
pub struct JsonDecoder {
    schema: SchemaRef,
}

impl JsonDecoder {
    pub fn new(schema: SchemaRef) -> Self {
        JsonDecoder { schema }
    }

    /// Whether arrow-json can decode the schema's types.
    pub fn check(&self) -> Result<(), ArrowError> {
        self.decoder(1).map(|_| ())
    }

    fn decoder(&self, rows: usize) -> Result<Decoder, ArrowError> {
        ReaderBuilder::new(Arc::clone(&self.schema))
            .with_batch_size(rows.max(1) + 1)
            .with_strict_mode(false)
            .with_decoder_factory(Arc::new(StrictFactory))
            .build_decoder()
    }

    /// Decode `values`; nulls are tombstones, values over `limit` bytes bad records.
    pub fn decode(&self, values: &BinaryArray, limit: Option<usize>) -> Result<Decoded, ArrowError> {
        let n = values.len();
        let mut keep: Vec<usize> = Vec::with_capacity(n);
        let mut bad: Vec<(i64, String)> = Vec::new();
        let mut tombstones = 0usize;
        for i in 0..n {
            if values.is_null(i) {
                tombstones += 1;
                continue;
            }
            let len = values.value(i).len();
            match limit {
                Some(max) if len > max => bad.push((i as i64, too_long(len, max))),
                _ => keep.push(i),
            }
        }
        let all = keep.len() == n;
        if keep.is_empty() {
            return Ok(Decoded { batch: None, rows: Some(Vec::new()), bad, tombstones });
        }
        if let Some(batch) = self.fast(values, &keep)? {
            let rows = if all { None } else { Some(keep.iter().map(|&i| i as i64).collect()) };
            return Ok(Decoded { batch: Some(batch), rows, bad, tombstones });
        }
        let (good, batch, mut errors) = self.one_by_one(values, &keep)?;
        bad.append(&mut errors);
        bad.sort_by_key(|(i, _)| *i);
        let rows = Some(good.iter().map(|&i| i as i64).collect());
        Ok(Decoded { batch, rows, bad, tombstones })
    }

    /// All of `idx` as one batch, or None if any value is not exactly one valid row.
    fn fast(&self, values: &BinaryArray, idx: &[usize]) -> Result<Option<RecordBatch>, ArrowError> {
        let mut d = self.decoder(idx.len())?;
        for &i in idx {
            let v = values.value(i);
            let before = d.len();
            match d.decode(v) {
                Ok(used) if used == v.len() => {}
                _ => return Ok(None),
            }
            if d.has_partial_record() || d.len() != before + 1 {
                return Ok(None);
            }
        }
        match d.flush() {
            Ok(Some(batch)) if batch.num_rows() == idx.len() => Ok(Some(batch)),
            _ => Ok(None),
        }
    }

    /// One value alone: its row, or why it is a bad record.
    fn one(&self, v: &[u8]) -> Result<RecordBatch, String> {
        let mut d = self.decoder(1).map_err(|e| error_text(&e))?;
        let used = d.decode(v).map_err(|e| error_text(&e))?;
        if used != v.len() {
            return Err("ArrowInvalid: JSON parse error: more than one JSON value".into());
        }
        d.decode(b"\n").map_err(|e| error_text(&e))?; // ends a bare scalar
        if d.has_partial_record() {
            return Err("ArrowInvalid: JSON parse error: the value ends inside a JSON value".into());
        }
        if d.len() != 1 {
            return Err(format!("1 record(s) decoded into {} row(s)", d.len()));
        }
        match d.flush() {
            Ok(Some(batch)) if batch.num_rows() == 1 => Ok(batch),
            Ok(_) => Err("1 record(s) decoded into 0 row(s)".into()),
            Err(e) => Err(error_text(&e)),
        }
    }

    #[allow(clippy::type_complexity)]
    fn one_by_one(
        &self,
        values: &BinaryArray,
        idx: &[usize],
    ) -> Result<(Vec<usize>, Option<RecordBatch>, Vec<(i64, String)>), ArrowError> {
        let mut good = Vec::new();
        let mut rows = Vec::new();
        let mut bad = Vec::new();
        for &i in idx {
            match self.one(values.value(i)) {
                Ok(batch) => {
                    good.push(i);
                    rows.push(batch);
                }
                Err(e) => bad.push((i as i64, e)),
            }
        }
        let batch = if rows.is_empty() {
            None
        } else {
            Some(arrow_select::concat::concat_batches(&self.schema, &rows)?)
        };
        Ok((good, batch, bad))
    }
}
