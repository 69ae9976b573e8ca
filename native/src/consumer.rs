//! The Python class `Consumer`: every call releases the GIL while librdkafka or the decoding works.

use std::sync::{Arc, Mutex, RwLock};

use arrow_array::{Array, RecordBatch, StructArray};
use arrow_pyarrow::{PyArrowType, ToPyArrow};
use arrow_schema::Schema;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::client::{self, Callback, Client, KafkaFailure, RawMessage};
use crate::fetch::{self, Fetched, Positions, Spec};
use crate::json::JsonDecoder;
use crate::py_wire::{self, AvroIds, JsonIds};
use crate::wire::{self, Wire};

create_exception!(_native, KafkaNativeError, PyException, "A librdkafka call failed: args (code, text).");

fn failure(f: KafkaFailure) -> PyErr {
    KafkaNativeError::new_err((f.code, f.text))
}

fn closed() -> PyErr {
    PyRuntimeError::new_err("the native Kafka consumer is closed")
}

fn poisoned<T>(_: T) -> PyErr {
    PyRuntimeError::new_err("the native Kafka consumer failed earlier (a panic in native code)")
}

/// What `consume` works with besides the client: stop offsets, topic names and a message buffer.
struct FetchState {
    positions: Positions,
    spec: Spec,
    buf: Vec<*mut RawMessage>,
}

// the raw message pointers live only within one `consume` call
unsafe impl Send for FetchState {}

/// A librdkafka consumer that hands its batches over as Arrow (see `native_reader.py`).
#[pyclass(module = "sluice.connectors.kafka._native", name = "Consumer")]
pub struct Consumer {
    client: RwLock<Client>,
    state: Mutex<FetchState>,
}

fn to_struct(py: Python<'_>, batch: RecordBatch) -> PyResult<Py<PyAny>> {
    Ok(StructArray::from(batch).into_data().to_pyarrow(py)?.unbind())
}

fn callbacks_to_py<'py>(py: Python<'py>, cbs: Vec<Callback>) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for cb in cbs {
        let item = match cb {
            Callback::Error { code, fatal, text } => ("error", code, fatal, text).into_pyobject(py)?.into_any(),
            Callback::Stats(json) => ("stats", json).into_pyobject(py)?.into_any(),
            Callback::Commit { code, text, offsets } => ("commit", code, text, offsets).into_pyobject(py)?.into_any(),
            Callback::Log { level, facility, text } => ("log", level, facility, text).into_pyobject(py)?.into_any(),
        };
        out.append(item)?;
    }
    Ok(out)
}

fn fetched_to_py<'py>(py: Python<'py>, f: Fetched) -> PyResult<Bound<'py, PyTuple>> {
    let events: Vec<(i32, Option<String>, i32, i64, String)> =
        f.events.into_iter().map(|e| (e.code, e.topic, e.partition, e.offset, e.text)).collect();
    let fields = to_struct(py, f.fields)?;
    let decoded = f.decoded.map(|d| py_wire::decoded_to_py(py, d)).transpose()?;
    (fields, f.tps, f.passed_end, f.nbytes, events, decoded).into_pyobject(py)
}

#[pymethods]
impl Consumer {
    /// Args: conf: librdkafka settings as (name, value) strings; need_*: which message fields to keep;
    /// json_schema: decode the values as JSON objects of this schema here (None: Python decodes them);
    /// wire: decode values in the schema registry's wire format (True) or plain Avro (False) here, once
    /// `configure_wire` says how; max_record_bytes: longer values are bad records (json_schema, wire).
    #[new]
    #[pyo3(signature = (conf, *, need_ts=false, need_keys=false, need_headers=false, json_schema=None, wire=None, max_record_bytes=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        conf: Vec<(String, String)>,
        need_ts: bool,
        need_keys: bool,
        need_headers: bool,
        json_schema: Option<PyArrowType<Schema>>,
        wire: Option<bool>,
        max_record_bytes: Option<usize>,
    ) -> PyResult<Self> {
        let json = json_schema.map(|s| JsonDecoder::new(Arc::new(s.0)));
        let wire = wire.map(Wire::new);
        let spec = Spec { need_ts, need_keys, need_headers, json, wire, max_record_bytes };
        let client = py.detach(|| Client::new(&conf)).map_err(failure)?;
        Ok(Consumer {
            client: RwLock::new(client),
            state: Mutex::new(FetchState { positions: Positions::default(), spec, buf: Vec::new() }),
        })
    }

    /// Up to `max_messages` messages within `timeout_s`, as a tuple (fields: pyarrow StructArray or None,
    /// tps: [(topic, partition)] by tp index, passed_end: [tp index], nbytes, events: [(code, topic,
    /// partition, offset, text)], decoded: (StructArray or None, Int64Array rows or None, [(index,
    /// error)], tombstones) or None) and the callbacks since the last call: [(kind, ...)].
    fn consume<'py>(&self, py: Python<'py>, max_messages: usize, timeout_s: f64) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyList>)> {
        let timeout_ms = (timeout_s * 1000.0).round().clamp(0.0, i32::MAX as f64) as i32;
        let (result, cbs) = py.detach(|| {
            let client = self.client.read().map_err(poisoned)?;
            if client.is_closed() {
                return Err(closed());
            }
            let mut st = self.state.lock().map_err(poisoned)?;
            let st = &mut *st;
            let mut buf = std::mem::take(&mut st.buf);
            let got = client.consume(max_messages.max(1), timeout_ms, &mut buf);
            let result = match got {
                Err(f) => Err(failure(f)),
                Ok(()) if buf.is_empty() => Ok(None),
                Ok(()) => {
                    let built = fetch::build(&buf, &mut st.spec, &mut st.positions);
                    Ok(Some(built))
                }
            };
            for &m in &buf {
                client::destroy(m);
            }
            buf.clear();
            st.buf = buf;
            Ok::<_, PyErr>((result, client.callbacks()))
        })?;
        let cbs = callbacks_to_py(py, cbs)?;
        let out = match result? {
            None => py.None().into_bound(py),
            Some(built) => {
                let f = built.map_err(|e| PyRuntimeError::new_err(format!("native Kafka batch: {e}")))?;
                fetched_to_py(py, f)?.into_any()
            }
        };
        Ok((out, cbs))
    }

    /// How to decode the wire format's schema ids (a consumer made with `wire`): `target`, the schema
    /// every batch is aligned to; `json`: [(id, Arrow schema)]; `avro`: [(id, writer schema, reader
    /// schema or None, label)]; `bad`: [(id, error)] (their records are bad). A batch with an id not
    /// given is not decoded (`decoded` is None). Returns the ids refused here, with why.
    fn configure_wire(
        &self,
        py: Python<'_>,
        target: PyArrowType<Schema>,
        json: JsonIds,
        avro: AvroIds,
        bad: Vec<(u32, String)>,
    ) -> PyResult<Vec<(u32, String)>> {
        let (target, json) = py_wire::schemas(target, json);
        py.detach(|| {
            let mut st = self.state.lock().map_err(poisoned)?;
            let Some(wire) = st.spec.wire.as_mut() else {
                return Err(PyRuntimeError::new_err("this consumer does not decode the wire format"));
            };
            Ok(wire::configure(wire, target, json, avro, bad))
        })
    }

    /// Add partitions to the assignment: (topic, partition, offset, stop offset or None).
    fn incremental_assign(&self, py: Python<'_>, tps: Vec<(String, i32, i64, Option<i64>)>) -> PyResult<()> {
        py.detach(|| {
            {
                let mut st = self.state.lock().map_err(poisoned)?;
                for (t, p, _, end) in &tps {
                    match end {
                        Some(e) => st.positions.ends.insert((t.clone(), *p), *e),
                        None => st.positions.ends.remove(&(t.clone(), *p)),
                    };
                }
            }
            let client = self.client.read().map_err(poisoned)?;
            if client.is_closed() {
                return Err(closed());
            }
            let at: Vec<(String, i32, i64)> = tps.into_iter().map(|(t, p, o, _)| (t, p, o)).collect();
            client.incremental_assign(&at).map_err(failure)
        })
    }

    /// Remove partitions from the assignment: (topic, partition).
    fn incremental_unassign(&self, py: Python<'_>, tps: Vec<(String, i32)>) -> PyResult<()> {
        py.detach(|| {
            let client = self.client.read().map_err(poisoned)?;
            if client.is_closed() {
                return Err(closed());
            }
            client.incremental_unassign(&tps).map_err(failure)
        })
    }

    /// Commit (topic, partition, offset) to the consumer group; the result of an asynchronous commit
    /// comes with a later `consume` as a ("commit", ...) callback.
    #[pyo3(signature = (offsets, asynchronous=true))]
    fn commit(&self, py: Python<'_>, offsets: Vec<(String, i32, i64)>, asynchronous: bool) -> PyResult<()> {
        py.detach(|| {
            let client = self.client.read().map_err(poisoned)?;
            if client.is_closed() {
                return Err(closed());
            }
            client.commit(&offsets, asynchronous).map_err(failure)
        })
    }

    /// The (low, high) watermark offsets of a partition, asked of the broker.
    fn get_watermark_offsets(&self, py: Python<'_>, topic: String, partition: i32, timeout_s: f64) -> PyResult<(i64, i64)> {
        let timeout_ms = (timeout_s * 1000.0).round().clamp(0.0, i32::MAX as f64) as i32;
        py.detach(|| {
            let client = self.client.read().map_err(poisoned)?;
            if client.is_closed() {
                return Err(closed());
            }
            client.watermarks(&topic, partition, timeout_ms).map_err(failure)
        })
    }

    /// Leave the group and free the client (callbacks reported meanwhile are returned).
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let cbs = py.detach(|| {
            let mut client = self.client.write().map_err(poisoned)?;
            client.close();
            Ok::<_, PyErr>(client.callbacks())
        })?;
        callbacks_to_py(py, cbs)
    }

    /// Whether `close` ran.
    #[getter]
    fn closed(&self) -> bool {
        self.client.read().map(|c| c.is_closed()).unwrap_or(true)
    }
}
