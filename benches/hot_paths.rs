//! The hot paths of every append and read: offset parsing, JSON normalisation, record encoding
//! for storage, and SSE frame rendering. `cargo bench` runs them; `cargo bench -- offset` one.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use runnel::model::json::{self, EmptyArray};
use runnel::model::record::lay_out;
use runnel::model::sse::data_event;
use runnel::model::{Offset, ReadFrom};
use runnel::storage::codec::{decode_stored, encode_record, runs};

fn offsets(c: &mut Criterion) {
    let mut group = c.benchmark_group("offset");
    group.bench_function("parse", |b| {
        b.iter(|| Offset::parse_token(black_box("0000000000001234_0000000000567890")))
    });
    group.bench_function("parse read position", |b| {
        b.iter(|| ReadFrom::parse(black_box("0000000000001234_0000000000567890")))
    });
    let offset = Offset::new(1234, 567_890);
    group.bench_function("render", |b| b.iter(|| black_box(offset).to_string()));
    group.finish();
}

fn json_normalisation(c: &mut Criterion) {
    let one = br#"{"user": "ada", "n": 42, "tags": ["a", "b"], "nested": {"x": 1.5, "y": null}}"#;
    let array: Vec<u8> = {
        let mut body = b"[".to_vec();
        for i in 0..10 {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(one);
        }
        body.push(b']');
        body
    };
    let mut group = c.benchmark_group("json");
    group.throughput(Throughput::Bytes(one.len() as u64));
    group.bench_function("one message", |b| {
        b.iter(|| json::messages(black_box(one), EmptyArray::Rejected))
    });
    group.throughput(Throughput::Bytes(array.len() as u64));
    group.bench_function("array of 10 messages", |b| {
        b.iter(|| json::messages(black_box(&array), EmptyArray::Rejected))
    });
    group.finish();
}

fn record_encoding(c: &mut Criterion) {
    let body = Bytes::from(vec![b'x'; 256]);
    let record = lay_out(Offset::new(7, 1792), 1_764_000_000_000, vec![body])
        .pop()
        .expect("one record");
    let encoded = Bytes::from(encode_record(&record));
    let mut group = c.benchmark_group("record");
    group.throughput(Throughput::Bytes(256));
    group.bench_function("encode 256 B", |b| {
        b.iter(|| encode_record(black_box(&record)))
    });
    group.bench_function("decode 256 B", |b| {
        b.iter(|| decode_stored(7, black_box(encoded.clone())))
    });
    group.finish();

    // An append-batch of 512 frames: encoded into runs, and one run decoded.
    let bodies = vec![Bytes::from(vec![b'x'; 256]); 512];
    let batch = lay_out(Offset::new(0, 0), 1_764_000_000_000, bodies);
    let run = runs(&batch).next().expect("one run at least");
    let last = run.records().last().expect("a run is never empty").seq;
    let encoded = Bytes::from(run.encode());
    let mut group = c.benchmark_group("run");
    group.throughput(Throughput::Bytes(512 * 256));
    group.bench_function("encode 512 x 256 B", |b| {
        b.iter(|| {
            runs(black_box(&batch))
                .map(|run| run.encode().len())
                .sum::<usize>()
        })
    });
    group.throughput(Throughput::Bytes(encoded.len() as u64));
    group.bench_function("decode one run", |b| {
        b.iter(|| decode_stored(last, black_box(encoded.clone())))
    });
    group.finish();
}

fn sse_frames(c: &mut Criterion) {
    let text: Vec<u8> = b"line of event text\n".repeat(54);
    let binary: Vec<u8> = (0..=255u8).cycle().take(1024).collect();
    let mut group = c.benchmark_group("sse");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("data event, 1 KiB text", |b| {
        b.iter(|| data_event(black_box(&text), false))
    });
    group.throughput(Throughput::Bytes(binary.len() as u64));
    group.bench_function("data event, 1 KiB base64", |b| {
        b.iter(|| data_event(black_box(&binary), true))
    });
    group.finish();
}

criterion_group!(
    hot_paths,
    offsets,
    json_normalisation,
    record_encoding,
    sse_frames
);
criterion_main!(hot_paths);
