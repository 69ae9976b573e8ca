//! The wire-format decoding as Python sees it: the arguments that fill a [`Wire`]'s table, the decoded
//! tuple, and `WireDecoder` (the same decoding without a consumer, for tests and measurements).

use std::sync::{Arc, Mutex};

use arrow_array::{Array, BinaryArray, Int64Array, StructArray};
use arrow_data::ArrayData;
use arrow_pyarrow::{PyArrowType, ToPyArrow};
use arrow_schema::{DataType, Schema, SchemaRef};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;

use crate::json::Decoded;
use crate::wire::{self, Wire};

/// JSON ids with their Arrow schema.
pub type JsonIds = Vec<(u32, PyArrowType<Schema>)>;
/// Avro ids: (id, writer schema, reader schema or None, label for errors).
pub type AvroIds = Vec<(u32, String, Option<String>, String)>;

/// The schemas of `configure`'s arguments, as [`wire::configure`] takes them.
pub fn schemas(target: PyArrowType<Schema>, json: JsonIds) -> (SchemaRef, Vec<(u32, SchemaRef)>) {
    (Arc::new(target.0), json.into_iter().map(|(id, s)| (id, Arc::new(s.0))).collect())
}

/// `(batch: StructArray or None, rows: Int64Array or None, bad: [(index, error)], tombstones)`.
pub fn decoded_to_py(py: Python<'_>, d: Decoded) -> PyResult<Py<PyAny>> {
    let batch = d.batch.map(|b| StructArray::from(b).into_data().to_pyarrow(py).map(|a| a.unbind())).transpose()?;
    let rows = d.rows.map(|r| Int64Array::from(r).into_data().to_pyarrow(py).map(|a| a.unbind())).transpose()?;
    Ok((batch, rows, d.bad, d.tombstones).into_pyobject(py)?.into_any().unbind())
}

/// Wire-format values decoded as the native consumer decodes them.
#[pyclass(module = "sluice.connectors.kafka._native", name = "WireDecoder")]
pub struct WireDecoder {
    wire: Mutex<Wire>,
}

#[pymethods]
impl WireDecoder {
    /// Args: framed: values carry the magic byte and a schema id (False: plain Avro, all of id 0).
    #[new]
    #[pyo3(signature = (framed=true))]
    fn new(framed: bool) -> Self {
        WireDecoder { wire: Mutex::new(Wire::new(framed)) }
    }

    /// Replace the table of ids (see the consumer's `configure_wire`); returns the ids refused, with why.
    fn configure(
        &self,
        py: Python<'_>,
        target: PyArrowType<Schema>,
        json: JsonIds,
        avro: AvroIds,
        bad: Vec<(u32, String)>,
    ) -> PyResult<Vec<(u32, String)>> {
        let (target, json) = schemas(target, json);
        py.detach(|| {
            let mut w = self.wire.lock().map_err(|_| PyRuntimeError::new_err("poisoned"))?;
            Ok(wire::configure(&mut w, target, json, avro, bad))
        })
    }

    /// Decode a pyarrow BinaryArray of values: the decoded tuple, or None if a schema id is unknown.
    #[pyo3(signature = (values, max_record_bytes=None))]
    fn decode(&self, py: Python<'_>, values: PyArrowType<ArrayData>, max_record_bytes: Option<usize>) -> PyResult<Option<Py<PyAny>>> {
        if values.0.data_type() != &DataType::Binary {
            return Err(PyTypeError::new_err(format!("values must be a binary array, not {}", values.0.data_type())));
        }
        let values = BinaryArray::from(values.0);
        let got = py.detach(|| {
            let mut w = self.wire.lock().map_err(|_| PyRuntimeError::new_err("poisoned"))?;
            w.decode(&values, max_record_bytes).map_err(|e| PyRuntimeError::new_err(format!("native wire decoding: {e}")))
        })?;
        got.map(|d| decoded_to_py(py, d)).transpose()
    }
}
