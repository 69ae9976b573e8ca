//! A walk over Avro datums that checks what `arrow-avro` does not: the branch index of every union
//! (it reads any index other than the null branch's of a `["null", T]` union as `T`, where fastavro, and
//! so sluice's Python decoder, refuses the record), and enum indices on the way. Only schemas with a
//! union are walked.

use std::collections::HashMap;

use serde_json::Value;

enum Node {
    Null,
    Bool,
    Varint,
    Fixed(usize),
    Bytes,
    Enum(usize),
    Array(usize),
    Map(usize),
    Record(Vec<usize>),
    Union(Vec<usize>),
}

/// The shape of a writer schema, as far as the walk needs it.
pub struct Shape {
    nodes: Vec<Node>,
    root: usize,
    /// whether the schema has a union (else there is nothing to check)
    pub has_union: bool,
}

fn full_name(name: &str, ns: Option<&str>) -> String {
    match ns {
        Some(n) if !name.contains('.') && !n.is_empty() => format!("{n}.{name}"),
        _ => name.to_string(),
    }
}

struct Parser {
    nodes: Vec<Node>,
    names: HashMap<String, usize>,
    has_union: bool,
}

impl Parser {
    fn push(&mut self, n: Node) -> usize {
        self.nodes.push(n);
        self.nodes.len() - 1
    }

    fn named(&mut self, o: &serde_json::Map<String, Value>, ns: Option<&str>, n: Node) -> Result<(usize, Option<String>), String> {
        let name = o.get("name").and_then(Value::as_str).ok_or("a named type without a name")?;
        let own_ns = o.get("namespace").and_then(Value::as_str).or(ns);
        let full = full_name(name, own_ns);
        let ns_out = full.rsplit_once('.').map(|(n, _)| n.to_string());
        let i = self.push(n);
        self.names.insert(full, i);
        Ok((i, ns_out))
    }

    fn parse(&mut self, v: &Value, ns: Option<&str>) -> Result<usize, String> {
        match v {
            Value::String(s) => self.simple(s, ns),
            Value::Array(branches) => {
                self.has_union = true;
                let kids = branches.iter().map(|b| self.parse(b, ns)).collect::<Result<Vec<_>, _>>()?;
                Ok(self.push(Node::Union(kids)))
            }
            Value::Object(o) => match o.get("type") {
                Some(Value::String(t)) => match t.as_str() {
                    "record" | "error" => {
                        let (i, inner) = self.named(o, ns, Node::Record(Vec::new()))?;
                        let fields = o.get("fields").and_then(Value::as_array).ok_or("a record without fields")?;
                        let mut kids = Vec::with_capacity(fields.len());
                        for f in fields {
                            kids.push(self.parse(f.get("type").ok_or("a field without a type")?, inner.as_deref())?);
                        }
                        self.nodes[i] = Node::Record(kids);
                        Ok(i)
                    }
                    "enum" => {
                        let n = o.get("symbols").and_then(Value::as_array).map_or(0, Vec::len);
                        Ok(self.named(o, ns, Node::Enum(n))?.0)
                    }
                    "fixed" => {
                        let n = o.get("size").and_then(Value::as_u64).ok_or("a fixed without a size")? as usize;
                        Ok(self.named(o, ns, Node::Fixed(n))?.0)
                    }
                    "array" => {
                        let k = self.parse(o.get("items").ok_or("an array without items")?, ns)?;
                        Ok(self.push(Node::Array(k)))
                    }
                    "map" => {
                        let k = self.parse(o.get("values").ok_or("a map without values")?, ns)?;
                        Ok(self.push(Node::Map(k)))
                    }
                    other => self.simple(other, ns),
                },
                Some(inner) => self.parse(inner, ns),
                None => Err("a schema object without a type".into()),
            },
            _ => Err(format!("not a schema: {v}")),
        }
    }

    fn simple(&mut self, s: &str, ns: Option<&str>) -> Result<usize, String> {
        let n = match s {
            "null" => Node::Null,
            "boolean" => Node::Bool,
            "int" | "long" => Node::Varint,
            "float" => Node::Fixed(4),
            "double" => Node::Fixed(8),
            "bytes" | "string" => Node::Bytes,
            name => {
                let found = self.names.get(&full_name(name, ns)).or_else(|| self.names.get(name));
                return found.copied().ok_or_else(|| format!("unknown type {name}"));
            }
        };
        Ok(self.push(n))
    }
}

fn varint(buf: &[u8], pos: &mut usize) -> Option<i64> {
    let mut raw: u64 = 0;
    for shift in (0..70).step_by(7) {
        let b = *buf.get(*pos)?;
        *pos += 1;
        raw |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some((raw >> 1) as i64 ^ -((raw & 1) as i64));
        }
    }
    None
}

/// Why a datum is refused: a union branch or enum index out of range, or bytes that end early (which
/// `arrow-avro` reports itself).
pub enum Refusal {
    Invalid(String),
    Short,
}

impl Shape {
    /// The shape of the Avro schema `text`.
    pub fn parse(text: &str) -> Result<Shape, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let mut p = Parser { nodes: Vec::new(), names: HashMap::new(), has_union: false };
        let root = p.parse(&v, None)?;
        Ok(Shape { nodes: p.nodes, root, has_union: p.has_union })
    }

    /// Check one datum.
    pub fn check(&self, buf: &[u8]) -> Result<(), Refusal> {
        let mut pos = 0usize;
        self.walk(self.root, buf, &mut pos, 0)
    }

    fn walk(&self, i: usize, buf: &[u8], pos: &mut usize, depth: usize) -> Result<(), Refusal> {
        if depth > 256 {
            return Err(Refusal::Short);
        }
        let take = |pos: &mut usize, n: usize| -> Result<(), Refusal> {
            if buf.len().saturating_sub(*pos) < n {
                return Err(Refusal::Short);
            }
            *pos += n;
            Ok(())
        };
        match &self.nodes[i] {
            Node::Null => Ok(()),
            Node::Bool => take(pos, 1),
            Node::Fixed(n) => take(pos, *n),
            Node::Varint => varint(buf, pos).map(|_| ()).ok_or(Refusal::Short),
            Node::Enum(n) => match varint(buf, pos).ok_or(Refusal::Short)? {
                k if (0..*n as i64).contains(&k) => Ok(()),
                k => Err(Refusal::Invalid(format!("enum index {k} of {n} symbols"))),
            },
            Node::Bytes => {
                let n = varint(buf, pos).ok_or(Refusal::Short)?;
                take(pos, usize::try_from(n).map_err(|_| Refusal::Short)?)
            }
            Node::Record(kids) => kids.iter().try_for_each(|&k| self.walk(k, buf, pos, depth + 1)),
            Node::Union(kids) => {
                let b = varint(buf, pos).ok_or(Refusal::Short)?;
                match usize::try_from(b).ok().and_then(|b| kids.get(b)) {
                    Some(&k) => self.walk(k, buf, pos, depth + 1),
                    None => Err(Refusal::Invalid(format!("union branch index {b} of a union of {} types", kids.len()))),
                }
            }
            Node::Array(item) | Node::Map(item) => {
                let map = matches!(self.nodes[i], Node::Map(_));
                loop {
                    let mut count = varint(buf, pos).ok_or(Refusal::Short)?;
                    if count == 0 {
                        return Ok(());
                    }
                    if count < 0 {
                        count = count.checked_neg().ok_or(Refusal::Short)?;
                        varint(buf, pos).ok_or(Refusal::Short)?; // the block's size in bytes
                    }
                    for _ in 0..count {
                        let before = *pos;
                        if map {
                            let n = varint(buf, pos).ok_or(Refusal::Short)?;
                            take(pos, usize::try_from(n).map_err(|_| Refusal::Short)?)?;
                        }
                        self.walk(*item, buf, pos, depth + 1)?;
                        if *pos == before {
                            break; // items of no bytes (null, an empty record): the rest are alike
                        }
                    }
                }
            }
        }
    }
}
