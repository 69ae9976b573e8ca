//! A librdkafka consumer through the C API of the bundled librdkafka (`rdkafka-sys`).
//!
//! The calls are those confluent-kafka's `Consumer` makes (so the behaviour is the same librdkafka's):
//! `rd_kafka_poll_set_consumer` routes every event to the consumer queue, `rd_kafka_consume_batch_queue`
//! reads messages and serves the callbacks (errors, statistics, offset commits), which are collected
//! here and handed to Python with the next batch (no callback ever needs the GIL).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;
use std::sync::Mutex;

use rdkafka_sys as rd;

/// What librdkafka reported through a callback, for Python to dispatch.
pub enum Callback {
    /// `error_cb`: code, whether it is fatal, text.
    Error { code: i32, fatal: bool, text: String },
    /// `stats_cb`: the statistics JSON.
    Stats(String),
    /// `offset_commit_cb`: the request's error code, its text, and each partition's (topic, partition, offset, code).
    Commit { code: i32, text: String, offsets: Vec<(String, i32, i64, i32)> },
    /// `log_cb`: syslog level, facility, line.
    Log { level: i32, facility: String, text: String },
}

/// The callbacks' sink: librdkafka calls them on its threads or in `consume`, so behind a lock.
#[derive(Default)]
pub struct Callbacks {
    items: Mutex<Vec<Callback>>,
}

impl Callbacks {
    fn push(&self, cb: Callback) {
        if let Ok(mut items) = self.items.lock() {
            if items.len() < 10_000 {
                items.push(cb);
            }
        }
    }

    /// Everything reported since the last call.
    pub fn take(&self) -> Vec<Callback> {
        self.items.lock().map(|mut v| std::mem::take(&mut *v)).unwrap_or_default()
    }
}

/// `rd_kafka_message_t` as laid out in rdkafka.h, with `err` as a plain int (librdkafka may report a
/// code the generated enum does not list).
#[repr(C)]
pub struct RawMessage {
    pub err: c_int,
    pub rkt: *mut rd::rd_kafka_topic_t,
    pub partition: i32,
    pub payload: *mut c_void,
    pub len: usize,
    pub key: *mut c_void,
    pub key_len: usize,
    pub offset: i64,
    _private: *mut c_void,
}

extern "C" {
    #[link_name = "rd_kafka_err2str"]
    fn err2str(err: c_int) -> *const c_char;
}

/// librdkafka's text of an error code.
pub fn error_text(code: i32) -> String {
    unsafe { cstr(err2str(code)) }
}

unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// A failed call: librdkafka's error code and text.
pub struct KafkaFailure {
    pub code: i32,
    pub text: String,
}

impl KafkaFailure {
    fn of(code: i32) -> Self {
        KafkaFailure { code, text: error_text(code) }
    }
}

const RD_KAFKA_RESP_ERR_FATAL: i32 = -150;
const ERRSTR: usize = 512;

unsafe extern "C" fn on_error(rk: *mut rd::rd_kafka_t, err: c_int, reason: *const c_char, opaque: *mut c_void) {
    let cbs = &*(opaque as *const Callbacks);
    let (mut code, mut text, mut fatal) = (err, cstr(reason), false);
    if err == RD_KAFKA_RESP_ERR_FATAL {
        let mut buf = [0 as c_char; ERRSTR];
        code = rd::rd_kafka_fatal_error(rk, buf.as_mut_ptr(), ERRSTR) as i32;
        text = cstr(buf.as_ptr());
        fatal = true;
    }
    cbs.push(Callback::Error { code, fatal, text });
}

unsafe extern "C" fn on_stats(_rk: *mut rd::rd_kafka_t, json: *mut c_char, len: usize, opaque: *mut c_void) -> c_int {
    let cbs = &*(opaque as *const Callbacks);
    let bytes = std::slice::from_raw_parts(json as *const u8, len);
    cbs.push(Callback::Stats(String::from_utf8_lossy(bytes).into_owned()));
    0 // librdkafka frees the buffer
}

unsafe extern "C" fn on_commit(
    _rk: *mut rd::rd_kafka_t,
    err: rd::rd_kafka_resp_err_t,
    offsets: *mut rd::rd_kafka_topic_partition_list_t,
    opaque: *mut c_void,
) {
    let cbs = &*(opaque as *const Callbacks);
    let code = err as i32;
    let mut out = Vec::new();
    if !offsets.is_null() {
        let list = &*offsets;
        for i in 0..list.cnt.max(0) as usize {
            let e = &*list.elems.add(i);
            out.push((cstr(e.topic), e.partition, e.offset, e.err as i32));
        }
    }
    let text = if code == 0 { String::new() } else { error_text(code) };
    cbs.push(Callback::Commit { code, text, offsets: out });
}

unsafe extern "C" fn on_log(rk: *const rd::rd_kafka_t, level: c_int, fac: *const c_char, buf: *const c_char) {
    let opaque = rd::rd_kafka_opaque(rk);
    if opaque.is_null() {
        return;
    }
    let cbs = &*(opaque as *const Callbacks);
    cbs.push(Callback::Log { level, facility: cstr(fac), text: cstr(buf) });
}

/// One consumer: the client handle, its consumer queue and the callbacks' sink (freed after the client).
pub struct Client {
    rk: *mut rd::rd_kafka_t,
    queue: *mut rd::rd_kafka_queue_t,
    callbacks: Box<Callbacks>,
}

// librdkafka's handles are thread-safe (the consumer queue is read under the caller's lock, one
// `consume` at a time); the Python side serializes the calls anyway
unsafe impl Send for Client {}
unsafe impl Sync for Client {}

fn c_string(s: &str) -> Result<CString, KafkaFailure> {
    CString::new(s).map_err(|_| KafkaFailure { code: -186, text: format!("{s:?} holds a NUL character") })
}

fn partition_list(tps: &[(String, i32, i64)]) -> Result<*mut rd::rd_kafka_topic_partition_list_t, KafkaFailure> {
    let topics = tps.iter().map(|(t, _, _)| c_string(t)).collect::<Result<Vec<_>, _>>()?;
    unsafe {
        let list = rd::rd_kafka_topic_partition_list_new(tps.len() as c_int);
        for ((_, p, off), topic) in tps.iter().zip(&topics) {
            let e = rd::rd_kafka_topic_partition_list_add(list, topic.as_ptr(), *p);
            (*e).offset = *off;
        }
        Ok(list)
    }
}

unsafe fn error_result(err: *mut rd::rd_kafka_error_t) -> Result<(), KafkaFailure> {
    if err.is_null() {
        return Ok(());
    }
    let code = rd::rd_kafka_error_code(err) as i32;
    let text = cstr(rd::rd_kafka_error_string(err));
    rd::rd_kafka_error_destroy(err);
    Err(KafkaFailure { code, text })
}

impl Client {
    /// A consumer configured by `conf` (librdkafka property names and values), its callbacks collected.
    pub fn new(conf: &[(String, String)]) -> Result<Client, KafkaFailure> {
        let callbacks = Box::new(Callbacks::default());
        unsafe {
            let c = rd::rd_kafka_conf_new();
            let mut errstr = [0 as c_char; ERRSTR];
            for (k, v) in conf {
                let (ck, cv) = match (c_string(k), c_string(v)) {
                    (Ok(ck), Ok(cv)) => (ck, cv),
                    (Err(e), _) | (_, Err(e)) => {
                        rd::rd_kafka_conf_destroy(c);
                        return Err(e);
                    }
                };
                let res = rd::rd_kafka_conf_set(c, ck.as_ptr(), cv.as_ptr(), errstr.as_mut_ptr(), ERRSTR);
                if res != rd::rd_kafka_conf_res_t::RD_KAFKA_CONF_OK {
                    rd::rd_kafka_conf_destroy(c);
                    return Err(KafkaFailure { code: -186, text: cstr(errstr.as_ptr()) });
                }
            }
            rd::rd_kafka_conf_set_opaque(c, &*callbacks as *const Callbacks as *mut c_void);
            rd::rd_kafka_conf_set_error_cb(c, Some(on_error));
            rd::rd_kafka_conf_set_stats_cb(c, Some(on_stats));
            rd::rd_kafka_conf_set_offset_commit_cb(c, Some(on_commit));
            rd::rd_kafka_conf_set_log_cb(c, Some(on_log));
            let rk = rd::rd_kafka_new(rd::rd_kafka_type_t::RD_KAFKA_CONSUMER, c, errstr.as_mut_ptr(), ERRSTR);
            if rk.is_null() {
                rd::rd_kafka_conf_destroy(c); // rd_kafka_new owns the configuration only when it succeeds
                return Err(KafkaFailure { code: -186, text: cstr(errstr.as_ptr()) });
            }
            rd::rd_kafka_poll_set_consumer(rk);
            let queue = rd::rd_kafka_queue_get_consumer(rk);
            Ok(Client { rk, queue, callbacks })
        }
    }

    /// The callbacks reported since the last call.
    pub fn callbacks(&self) -> Vec<Callback> {
        self.callbacks.take()
    }

    /// Up to `out.capacity()` messages (or events) within `timeout_ms`, into `out`; the caller destroys
    /// them with [`destroy`].
    pub fn consume(&self, max: usize, timeout_ms: i32, out: &mut Vec<*mut RawMessage>) -> Result<(), KafkaFailure> {
        out.clear();
        out.resize(max, ptr::null_mut());
        let n = unsafe {
            rd::rd_kafka_consume_batch_queue(
                self.queue,
                timeout_ms,
                out.as_mut_ptr() as *mut *mut rd::rd_kafka_message_t,
                max,
            )
        };
        if n < 0 {
            out.clear();
            return Err(KafkaFailure::of(unsafe { rd::rd_kafka_last_error() } as i32));
        }
        out.truncate(n as usize);
        Ok(())
    }

    /// Add partitions at the given offsets to the assignment.
    pub fn incremental_assign(&self, tps: &[(String, i32, i64)]) -> Result<(), KafkaFailure> {
        let list = partition_list(tps)?;
        unsafe {
            let res = error_result(rd::rd_kafka_incremental_assign(self.rk, list));
            rd::rd_kafka_topic_partition_list_destroy(list);
            res
        }
    }

    /// Remove partitions from the assignment.
    pub fn incremental_unassign(&self, tps: &[(String, i32)]) -> Result<(), KafkaFailure> {
        let with: Vec<(String, i32, i64)> = tps.iter().map(|(t, p)| (t.clone(), *p, -1001)).collect();
        let list = partition_list(&with)?;
        unsafe {
            let res = error_result(rd::rd_kafka_incremental_unassign(self.rk, list));
            rd::rd_kafka_topic_partition_list_destroy(list);
            res
        }
    }

    /// Commit offsets to the group; `asynchronous`: the result comes through the commit callback.
    pub fn commit(&self, tps: &[(String, i32, i64)], asynchronous: bool) -> Result<(), KafkaFailure> {
        let list = partition_list(tps)?;
        unsafe {
            let code = rd::rd_kafka_commit(self.rk, list, asynchronous as c_int) as i32;
            rd::rd_kafka_topic_partition_list_destroy(list);
            if code != 0 {
                return Err(KafkaFailure::of(code));
            }
        }
        Ok(())
    }

    /// The partition's (low, high) watermark offsets, asked of the broker.
    pub fn watermarks(&self, topic: &str, partition: i32, timeout_ms: i32) -> Result<(i64, i64), KafkaFailure> {
        let t = c_string(topic)?;
        let (mut low, mut high) = (-1i64, -1i64);
        let code = unsafe {
            rd::rd_kafka_query_watermark_offsets(self.rk, t.as_ptr(), partition, &mut low, &mut high, timeout_ms)
        } as i32;
        if code != 0 {
            return Err(KafkaFailure::of(code));
        }
        Ok((low, high))
    }

    /// Leave the group and free the client (idempotent).
    pub fn close(&mut self) {
        if self.rk.is_null() {
            return;
        }
        unsafe {
            rd::rd_kafka_consumer_close(self.rk);
            rd::rd_kafka_queue_destroy(self.queue);
            rd::rd_kafka_destroy(self.rk);
        }
        self.rk = ptr::null_mut();
        self.queue = ptr::null_mut();
    }

    pub fn is_closed(&self) -> bool {
        self.rk.is_null()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.close(); // before `callbacks` is freed: librdkafka may call back until it is destroyed
    }
}

/// Free a message `consume` returned.
pub fn destroy(m: *mut RawMessage) {
    unsafe { rd::rd_kafka_message_destroy(m as *mut rd::rd_kafka_message_t) }
}

/// The message's timestamp in ms (-1: none).
pub fn timestamp(m: *const RawMessage) -> i64 {
    let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
    unsafe { rd::rd_kafka_message_timestamp(m as *const rd::rd_kafka_message_t, &mut kind) }
}

/// The message's headers as (name, value) pairs (None: the message has none).
pub fn headers(m: *const RawMessage) -> Option<Vec<(String, Option<Vec<u8>>)>> {
    unsafe {
        let mut hdrs: *mut rd::rd_kafka_headers_t = ptr::null_mut();
        if rd::rd_kafka_message_headers(m as *const rd::rd_kafka_message_t, &mut hdrs) as i32 != 0 || hdrs.is_null() {
            return None;
        }
        let mut out = Vec::new();
        let mut idx = 0usize;
        loop {
            let (mut name, mut value, mut size) = (ptr::null(), ptr::null(), 0usize);
            if rd::rd_kafka_header_get_all(hdrs, idx, &mut name, &mut value, &mut size) as i32 != 0 {
                break;
            }
            let v = if value.is_null() { None } else { Some(std::slice::from_raw_parts(value as *const u8, size).to_vec()) };
            out.push((cstr(name), v));
            idx += 1;
        }
        Some(out)
    }
}

/// The name of a message's topic.
pub fn topic_name(rkt: *mut rd::rd_kafka_topic_t) -> String {
    unsafe { cstr(rd::rd_kafka_topic_name(rkt)) }
}

/// The librdkafka version this module was built with.
pub fn version() -> String {
    unsafe { cstr(rd::rd_kafka_version_str()) }
}
