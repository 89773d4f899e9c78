//! Every reader of stored bytes, fed arbitrary bytes and mutated valid encodings: each returns
//! a value or an error naming the file, never panics, and never allocates by a declared length
//! the bytes do not back (the largest single allocation a decode makes is bounded by a small
//! multiple of its input; see `ftrec_core::fuzz`).
//!
//! Inputs come in five shapes: arbitrary bytes; a frame of the right kind around arbitrary
//! header and payload bytes (checksums correct, so the inner decoder is reached); raw mutations
//! (flip, insert, delete, truncate, a field overwritten with a huge value) of a valid file;
//! mutations of a valid file's header body or payload, re-sealed with correct checksums; and
//! the same with the frame's payload length overwritten. The JSON kinds (manifest, piece index)
//! also get structural mutations: a number, string or list of the valid document replaced by an
//! edge value, then re-sealed. `cargo fuzz` targets for longer runs are in `fuzz/` at the root.

use std::collections::BTreeMap;

use ftrec_ckpt::deck::{DeckMeta, Lineage, Retention};
use ftrec_ckpt::format::bundle::{encode_bundle, SectionIn};
use ftrec_ckpt::format::dense::encode_dense;
use ftrec_ckpt::format::qrows::encode_qrows;
use ftrec_ckpt::format::rows::encode_rows;
use ftrec_ckpt::format::{
    Bundle, CheckpointId, CheckpointKind, ChunkOp, ChunkRecord, CurrentPointer, DataPosition,
    DenseChunk, DenseInfo, FileChecksums, FileContent, FileInfo, FileRef, Manifest, Part,
    PieceIndex, PieceScheme, QRowChunk, QuantBits, RowChunk, ShardInfo, TableInfo,
};
use ftrec_ckpt::incr::ChunkList;
use ftrec_ckpt::CkptError;
use ftrec_core::fuzz::strategies::{config, huge, mutation};
use ftrec_core::fuzz::{alloc_bound, largest_allocation, mutated, AllocProbe, Mutation};
use ftrec_core::{RowLayout, ServerId, ShardMap, TableId, DENSE_BLOCK};
use proptest::prelude::*;
use serde_json::Value;

#[global_allocator]
static ALLOC: AllocProbe = AllocProbe;

const CASES: u32 = 192;

// ---- inputs ----

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(mutation(300), 1..4)
}

/// A file split into its frame parts: the first 12 bytes (magic, tag, version, reserved), the
/// header body after the payload length, and the payload.
struct Parts {
    prefix: Vec<u8>,
    head: Vec<u8>,
    payload: Vec<u8>,
}

fn split(file: &[u8]) -> Parts {
    let h = u32::from_le_bytes(file[12..16].try_into().unwrap()) as usize;
    Parts {
        prefix: file[..12].to_vec(),
        head: file[24..16 + h].to_vec(),
        payload: file[20 + h..file.len() - 4].to_vec(),
    }
}

/// A frame around `head` and `payload` with correct checksums; the declared payload length is
/// `payload_len` if given, else the payload's.
fn seal(prefix: &[u8], head: &[u8], payload: &[u8], payload_len: Option<u64>) -> Vec<u8> {
    let mut b = prefix[..12].to_vec();
    b.extend_from_slice(&((8 + head.len()) as u32).to_le_bytes());
    b.extend_from_slice(&payload_len.unwrap_or(payload.len() as u64).to_le_bytes());
    b.extend_from_slice(head);
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b.extend_from_slice(payload);
    b.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    b
}

/// One input derived from a valid file.
#[derive(Debug, Clone)]
enum Input {
    Arbitrary(Vec<u8>),
    Framed { head: Vec<u8>, payload: Vec<u8> },
    Raw(Vec<Mutation>),
    Head(Vec<Mutation>),
    Payload(Vec<Mutation>),
    PayloadLen(u64, Vec<Mutation>),
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200).prop_map(Input::Arbitrary),
        (
            prop::collection::vec(any::<u8>(), 0..64),
            prop::collection::vec(any::<u8>(), 0..300)
        )
            .prop_map(|(head, payload)| Input::Framed { head, payload }),
        mutations().prop_map(Input::Raw),
        mutations().prop_map(Input::Head),
        mutations().prop_map(Input::Payload),
        (huge(300), prop::collection::vec(mutation(300), 0..2))
            .prop_map(|(p, m)| Input::PayloadLen(p, m)),
    ]
}

fn make(valid: &[u8], i: &Input) -> Vec<u8> {
    let p = split(valid);
    match i {
        Input::Arbitrary(b) => b.clone(),
        Input::Framed { head, payload } => seal(&p.prefix, head, payload, None),
        Input::Raw(m) => mutated(valid, m),
        Input::Head(m) => seal(&p.prefix, &mutated(&p.head, m), &p.payload, None),
        Input::Payload(m) => seal(&p.prefix, &p.head, &mutated(&p.payload, m), None),
        Input::PayloadLen(len, m) => seal(&p.prefix, &p.head, &mutated(&p.payload, m), Some(*len)),
    }
}

/// Decode `data` as file `name`: an error must name the file; a value is handed to `use_it`
/// (which reads all of it); no single allocation may exceed the input's bound.
fn check(
    name: &str,
    data: &[u8],
    decode_and_use: impl FnOnce(&str, &[u8]) -> ftrec_ckpt::Result<()>,
) -> std::result::Result<bool, TestCaseError> {
    let (r, largest) = largest_allocation(|| decode_and_use(name, data));
    prop_assert!(
        largest <= alloc_bound(data.len()),
        "decoding {} bytes allocated {largest} bytes at once",
        data.len()
    );
    match r {
        Ok(()) => Ok(true),
        Err(e) => {
            prop_assert_eq!(e.file(), Some(name), "{}", e);
            Ok(false)
        }
    }
}

// ---- valid files ----

fn valid_rows(n: usize, dim: usize, state: usize) -> Vec<u8> {
    let layout = RowLayout::new(dim, state);
    let ids: Vec<u64> = (0..n as u64).map(|i| i * 3 + 1).collect();
    let rows: Vec<f32> = (0..n * layout.words()).map(|i| i as f32 * 0.25).collect();
    encode_rows(TableId(2), layout, ids, &rows)
        .unwrap()
        .bytes
        .to_vec()
}

fn valid_qrows(n: usize, dim: usize, bits: QuantBits) -> Vec<u8> {
    let layout = RowLayout::new(dim, 1);
    let ids: Vec<u64> = (0..n as u64).map(|i| i * 2 + 5).collect();
    let rows: Vec<f32> = (0..n * layout.words()).map(|i| i as f32 * -0.5).collect();
    encode_qrows(TableId(1), layout, bits, &ids, &rows)
        .unwrap()
        .0
        .bytes
        .to_vec()
}

fn valid_dense(values: usize, spb: usize) -> Vec<u8> {
    let v: Vec<f32> = (0..values).map(|i| i as f32).collect();
    let s = vec![0.5f32; values.div_ceil(DENSE_BLOCK) * spb];
    encode_dense(3, &v, &s, spb).unwrap().bytes.to_vec()
}

fn valid_bundle(sections: usize) -> Vec<u8> {
    let layouts = [
        RowLayout::new(2, 1),
        RowLayout::new(3, 0),
        RowLayout::new(1, 2),
    ];
    let ids: Vec<Vec<u64>> = (0..sections)
        .map(|s| (0..s as u64 + 1).map(|i| i * 7 + s as u64).collect())
        .collect();
    let rows: Vec<Vec<u8>> = (0..sections)
        .map(|s| vec![s as u8; ids[s].len() * layouts[s % 3].bytes()])
        .collect();
    let ins: Vec<SectionIn<'_>> = (0..sections)
        .map(|s| SectionIn {
            table: TableId(s as u32),
            layout: layouts[s % 3],
            column: s as u32 + 1,
            ids: &ids[s],
            rows: &rows[s],
        })
        .collect();
    encode_bundle(ServerId(1), &ins).unwrap().bytes.to_vec()
}

fn id(s: &str) -> CheckpointId {
    CheckpointId::new(s).unwrap()
}

fn sample_manifest() -> Manifest {
    let layout = RowLayout::new(4, 1);
    Manifest {
        id: CheckpointId::for_step(12, CheckpointKind::Full),
        kind: CheckpointKind::Full,
        step: 12,
        parents: vec![],
        data_position: DataPosition::Bytes(vec![0, 1, 0xab]),
        shards: vec![ShardInfo {
            server: ServerId(0),
            tables: vec![TableInfo {
                table: TableId(2),
                rows: 5,
                layout,
            }],
            dense: Some(DenseInfo {
                first_block: 0,
                blocks: 1,
                values: 10,
                state_per_block: 1,
            }),
        }],
        files: vec![
            FileInfo {
                path: "s0000/dense-000000.dense".into(),
                size: 64 + 11 * 4 + 4,
                crc32c: FileChecksums {
                    header: 7,
                    payload: 8,
                },
                content: FileContent::Dense {
                    server: ServerId(0),
                    first_block: 0,
                    blocks: 1,
                },
            },
            FileInfo {
                path: "s0000/t0002-000000.rows".into(),
                size: 68 + 5 * (8 + 20),
                crc32c: FileChecksums {
                    header: 9,
                    payload: 10,
                },
                content: FileContent::Rows {
                    server: ServerId(0),
                    table: TableId(2),
                    rows: 5,
                    first_row: 0,
                    last_row: 4,
                },
            },
        ],
        extra: BTreeMap::new(),
    }
}

fn part(file: u32, lo: u64, hi: u64, at: u64) -> Part {
    Part {
        file,
        section: 0,
        lo,
        hi,
        ids_at: at,
        rows_at: at + 8 * (hi - lo),
        row_bytes: 12,
        crc: 1,
    }
}

fn record(op: ChunkOp, col: u32, round: u32, rows: u64, file: u32) -> ChunkRecord {
    ChunkRecord {
        op,
        table: 0,
        range: 1,
        col,
        round,
        rows,
        min: 10,
        max: 10 + rows,
        parts: vec![part(file, 0, rows, 64)],
    }
}

/// Piece `col` of a chunk list over base `b`: a new column chunk and, from column 2 on, an
/// extraction from column `col - 1` (its extracted part and remainder).
fn sample_piece(col: u32) -> PieceIndex {
    let file = |c: u32| FileRef {
        ckpt: id(&format!("c{c}")),
        path: "s0001/row0-000000.bndl".into(),
        size: 4096,
        crc32c: FileChecksums {
            header: 1,
            payload: 2,
        },
    };
    let mut files = vec![file(col)];
    let mut chunks = vec![record(ChunkOp::Column, col, 0, 6, 0)];
    let mut row0 = vec![record(ChunkOp::Column, col, 0, 6, 0)];
    if col > 1 {
        files.push(file(col - 1));
        chunks.push(record(ChunkOp::Extracted, col - 1, col, 2, 1));
        chunks.push(record(ChunkOp::Remainder, col - 1, 0, 4, 0));
        row0.push(record(ChunkOp::Column, col - 1, 0, 4, 0));
    }
    PieceIndex {
        server: ServerId(1),
        scheme: PieceScheme::ChunkList,
        column: col,
        base: id("b"),
        quant: None,
        quant_max_abs_error: 0.0,
        range_rows: 64,
        base_bytes: 1000,
        restore_bytes: 300,
        read_bytes_per_s: 0.0,
        stats: Default::default(),
        files,
        chunks,
        row0,
    }
}

/// `p` as a version-1 piece index (a JSON payload, as earlier builds wrote it; still read).
fn piece_v1(p: &PieceIndex) -> Vec<u8> {
    let mut parts = split(&p.encode().unwrap().bytes);
    parts.prefix[8..10].copy_from_slice(&1u16.to_le_bytes());
    seal(
        &parts.prefix,
        &parts.head,
        &serde_json::to_vec(p).unwrap(),
        None,
    )
}

// ---- JSON mutations ----

/// Edit the `n`-th (mod count) leaf or list of `v`, depth first, with `edit`; returns whether a
/// place was found.
fn edit_nth(v: &mut Value, n: usize, edit: &JsonEdit) -> bool {
    fn count(v: &Value) -> usize {
        match v {
            Value::Array(a) => 1 + a.iter().map(count).sum::<usize>(),
            Value::Object(o) => o.values().map(count).sum(),
            _ => 1,
        }
    }
    fn go(v: &mut Value, n: &mut usize, edit: &JsonEdit) -> bool {
        let here = !v.is_object();
        if here {
            if *n == 0 {
                edit.apply(v);
                return true;
            }
            *n -= 1;
        }
        match v {
            Value::Array(a) => a.iter_mut().any(|x| go(x, n, edit)),
            Value::Object(o) => o.values_mut().any(|x| go(x, n, edit)),
            _ => false,
        }
    }
    let total = count(v);
    if total == 0 {
        return false;
    }
    let mut k = n % total;
    go(v, &mut k, edit)
}

#[derive(Debug, Clone)]
enum JsonEdit {
    Number(u64),
    Negative,
    Float,
    Text(String),
    Null,
    /// Repeat a list's first element (or wrap a leaf in a list).
    Repeat(usize),
    Empty,
}

impl JsonEdit {
    fn apply(&self, v: &mut Value) {
        let new = match self {
            JsonEdit::Number(x) => Value::from(*x),
            JsonEdit::Negative => Value::from(-1),
            JsonEdit::Float => Value::from(1.5e300),
            JsonEdit::Text(s) => Value::from(s.clone()),
            JsonEdit::Null => Value::Null,
            JsonEdit::Repeat(k) => match &*v {
                Value::Array(a) if !a.is_empty() => {
                    let first = a[0].clone();
                    let mut a = a.clone();
                    a.extend(std::iter::repeat_n(first, *k));
                    Value::Array(a)
                }
                other => Value::Array(vec![other.clone(); *k]),
            },
            JsonEdit::Empty => match &*v {
                Value::Array(_) => Value::Array(vec![]),
                _ => Value::from(""),
            },
        };
        *v = new;
    }
}

fn json_edit() -> impl Strategy<Value = JsonEdit> {
    prop_oneof![
        4 => huge(300).prop_map(JsonEdit::Number),
        1 => Just(JsonEdit::Negative),
        1 => Just(JsonEdit::Float),
        1 => prop::sample::select(vec!["", "../x", "a/b", "full", "delta", "\u{1F600}", "zz"])
            .prop_map(|s| JsonEdit::Text(s.to_string())),
        1 => Just(JsonEdit::Null),
        2 => (1usize..4).prop_map(JsonEdit::Repeat),
        1 => Just(JsonEdit::Empty),
    ]
}

fn json_edits() -> impl Strategy<Value = Vec<(usize, JsonEdit)>> {
    prop::collection::vec((any::<usize>(), json_edit()), 1..4)
}

/// `valid` (a framed JSON file) with its document edited and the frame re-sealed.
fn json_mutated(valid: &[u8], edits: &[(usize, JsonEdit)]) -> Vec<u8> {
    let p = split(valid);
    let mut v: Value = serde_json::from_slice(&p.payload).unwrap();
    for (n, e) in edits {
        edit_nth(&mut v, *n, e);
    }
    seal(&p.prefix, &p.head, &serde_json::to_vec(&v).unwrap(), None)
}

// ---- properties ----

proptest! {
    #![proptest_config(config(CASES))]

    #[test]
    fn row_files(n in 0usize..5, dim in 1usize..4, state in 0usize..2, i in input()) {
        let data = make(&valid_rows(n, dim, state), &i);
        check("s0/t2.rows", &data, |n, d| {
            let c = RowChunk::decode(n, d)?;
            let ids: Vec<u64> = c.ids().collect();
            assert_eq!(ids.len(), c.len());
            let mut dst = vec![0f32; c.len() * c.header.layout.words()];
            c.copy_rows(0, c.len(), &mut dst);
            Ok(())
        })?;
    }

    #[test]
    fn quantized_row_files(n in 0usize..5, dim in 1usize..5, four in any::<bool>(), i in input()) {
        let bits = if four { QuantBits::Four } else { QuantBits::Eight };
        let data = make(&valid_qrows(n, dim, bits), &i);
        check("s0/t1.qrows", &data, |n, d| {
            let c = QRowChunk::decode(n, d)?;
            let mut dst = vec![0f32; c.header.layout.words()];
            for r in 0..c.len() {
                c.dequantize_row(r, &mut dst);
            }
            assert_eq!(c.ids().count(), c.len());
            Ok(())
        })?;
    }

    #[test]
    fn dense_files(values in 0usize..600, spb in 0usize..3, i in input()) {
        let data = make(&valid_dense(values, spb), &i);
        check("s0/dense.dense", &data, |n, d| {
            let c = DenseChunk::decode(n, d)?;
            let mut v = vec![0f32; c.header.values as usize];
            let mut s = vec![0f32; (c.header.blocks * c.header.state_per_block as u64) as usize];
            c.copy_values(&mut v);
            c.copy_state(&mut s);
            Ok(())
        })?;
    }

    #[test]
    fn bundle_files(sections in 0usize..4, i in input()) {
        let data = make(&valid_bundle(sections), &i);
        check("s1/row0.bndl", &data, |n, d| {
            let b = Bundle::decode(n, d)?;
            for k in 0..b.sections().len() {
                let s = b.section(k);
                let mut row = vec![0f32; s.header.layout.words()];
                for r in 0..s.len() {
                    s.copy_row(r, &mut row);
                }
                assert_eq!(s.ids().count(), s.len());
            }
            Ok(())
        })?;
    }

    #[test]
    fn current_pointers(i in input()) {
        let valid = CurrentPointer {
            id: CheckpointId::for_step(7, CheckpointKind::Delta),
            manifest_size: 999,
            manifest_crc32c: FileChecksums { header: 1, payload: 2 },
            generation: 0,
        }
        .encode();
        let data = make(&valid.bytes, &i);
        check("CURRENT", &data, |n, d| {
            let p = CurrentPointer::decode(n, d)?;
            assert!(!p.id.as_str().is_empty());
            Ok(())
        })?;
    }

    #[test]
    fn manifests(i in input()) {
        let valid = sample_manifest().encode().unwrap();
        let data = make(&valid.bytes, &i);
        check("c/MANIFEST", &data, |n, d| {
            use_manifest(&Manifest::decode(n, d)?.0);
            Ok(())
        })?;
    }

    #[test]
    fn manifests_edited(edits in json_edits()) {
        let valid = sample_manifest().encode().unwrap();
        let data = json_mutated(&valid.bytes, &edits);
        check("c/MANIFEST", &data, |n, d| {
            use_manifest(&Manifest::decode(n, d)?.0);
            Ok(())
        })?;
    }

    #[test]
    fn piece_indexes(col in 1u32..4, i in input()) {
        let valid = sample_piece(col).encode().unwrap();
        let data = make(&valid.bytes, &i);
        check("s1/piece.pidx", &data, |n, d| {
            use_piece(&PieceIndex::decode(n, d)?.0);
            Ok(())
        })?;
    }

    #[test]
    fn piece_indexes_edited(col in 1u32..4, edits in json_edits()) {
        let valid = piece_v1(&sample_piece(col));
        let data = json_mutated(&valid, &edits);
        check("s1/piece.pidx", &data, |n, d| {
            use_piece(&PieceIndex::decode(n, d)?.0);
            Ok(())
        })?;
    }

    /// A chain of decoded piece indexes, some edited, folded into a chunk list (and its row 0
    /// rebuilt from the newest): an error or a list, never a panic.
    #[test]
    fn chunk_lists_folded_from_edited_pieces(
        len in 1u32..4,
        edits in prop::collection::vec((0u32..4, json_edits()), 0..3),
    ) {
        let mut pieces = Vec::new();
        for col in 1..=len {
            // Version 1 (JSON) for structural edits; version 2 when the piece is not edited.
            let mine: Vec<_> = edits.iter().filter(|(w, _)| *w == col).collect();
            let mut bytes = if mine.is_empty() {
                sample_piece(col).encode().unwrap().bytes.to_vec()
            } else {
                piece_v1(&sample_piece(col))
            };
            for (_, e) in mine {
                bytes = json_mutated(&bytes, e);
            }
            if let Ok((p, _)) = PieceIndex::decode("s1/piece.pidx", &bytes) {
                pieces.push(p);
            }
        }
        let map = ShardMap::new(2).unwrap();
        let (_, largest) = largest_allocation(|| {
            let mut list = ChunkList::new(id("b"), ServerId(1), map, 64);
            for (k, p) in pieces.iter().enumerate() {
                let ckpt = id(&format!("c{}", k + 1));
                if list.apply(&ckpt, p, "s1/piece.pidx").is_err() {
                    break;
                }
                for c in 0..=list.len() + 1 {
                    let _ = list.rectangle_bytes(c);
                }
                let _ = list.shape();
                let _ = list.dead_files().count();
            }
            if let Some(p) = pieces.last() {
                let columns = (1..=p.column).map(|c| id(&format!("c{c}"))).collect();
                if let Ok(l) = ChunkList::from_row0(id("b"), ServerId(1), map, columns, p, "f") {
                    let _ = l.rectangle_bytes(p.column);
                }
            }
        });
        prop_assert!(largest <= alloc_bound(64 << 10));
    }

    /// The lineage graph built from manifests that decode (any kinds, steps, parents, merge
    /// metadata and file sizes, cycles included): every query answers.
    #[test]
    fn lineage_of_any_manifests(
        nodes in prop::collection::vec(
            (0u8..3, huge(300), prop::option::of(0usize..8), prop::option::of((0usize..8, 0u32..3)), huge(300)),
            1..8,
        ),
        current in prop::option::of(0usize..10),
        every in huge(300),
        keep in 0usize..3,
    ) {
        let name = |k: usize| id(&format!("n{k}"));
        let mut ms = Vec::new();
        for (k, (kind, step, parent, meta, size)) in nodes.iter().enumerate() {
            let kind = [CheckpointKind::Full, CheckpointKind::Delta, CheckpointKind::Merged][*kind as usize];
            let mut m = Manifest {
                id: name(k),
                kind,
                step: *step,
                parents: if kind == CheckpointKind::Full {
                    vec![]
                } else {
                    vec![name(parent.unwrap_or(k + 1))]
                },
                data_position: DataPosition::None,
                shards: vec![ShardInfo { server: ServerId(0), tables: vec![], dense: None }],
                files: vec![
                    FileInfo {
                        path: format!("s0000/x{k}.pidx"),
                        size: *size,
                        crc32c: FileChecksums { header: 0, payload: 0 },
                        content: FileContent::PieceIndex {
                            server: ServerId(0),
                            scheme: PieceScheme::Incremental,
                            column: 1,
                        },
                    };
                    usize::from(kind == CheckpointKind::Delta) * 2
                ],
                extra: BTreeMap::new(),
            };
            for (j, f) in m.files.iter_mut().enumerate() {
                f.path = format!("s0000/x{k}-{j}.pidx");
            }
            if let Some((tip, layer)) = meta {
                DeckMeta {
                    tip: name(*tip),
                    layer: *layer,
                    merged_from: vec![name(*tip), name(k)],
                    deltas: *step,
                }
                .store_in(&mut m);
            }
            // Only what a store would hand the lineage: manifests that decode.
            let bytes = m.encode().unwrap();
            if let Ok((m, _)) = Manifest::decode("MANIFEST", &bytes.bytes) {
                ms.push(m);
            }
        }
        let l = Lineage::from_manifests(&ms, current.map(name));
        for k in 0..10 {
            let _ = l.resolve(&name(k));
            let _ = l.state_at_or_before(k as u64);
        }
        let _ = l.states_newest_first();
        let _ = l.newest_state();
        let _ = l.live(&Retention { full_every_steps: every, max_old_fulls: keep });
        let _ = l.render();
    }
}

/// Read everything a restore reads from a decoded manifest.
fn use_manifest(m: &Manifest) {
    let _ = m.data_bytes();
    let _ = m.piece_scheme();
    for s in &m.shards {
        let _ = m.files_of(s.server).count();
    }
    let l = Lineage::from_manifests([m], Some(m.id.clone()));
    let _ = l.resolve(&m.id);
    let _ = l.render();
}

fn use_piece(p: &PieceIndex) {
    for c in p.chunks.iter().chain(&p.row0) {
        for part in &c.parts {
            let _ = part.bytes();
        }
    }
    let map = ShardMap::new(2).unwrap();
    let mut list = ChunkList::new(p.base.clone(), p.server, map, p.range_rows);
    for col in 1..p.column.min(5) {
        // Earlier columns, as the chain before this piece would have built them.
        let _ = list.apply(&id(&format!("c{col}")), &sample_piece(col), "earlier");
    }
    let _ = list.apply(&id(&format!("c{}", p.column)), p, "s1/piece.pidx");
    let _ = list.rectangle_bytes(p.column);
}

/// Regression inputs found by the properties above, kept by name.
mod found {
    use super::*;

    #[test]
    fn a_manifest_whose_file_rows_overflow_is_refused() {
        let mut m = sample_manifest();
        m.shards[0].tables[0].rows = u64::MAX;
        if let FileContent::Rows { rows, .. } = &mut m.files[1].content {
            *rows = u64::MAX;
        }
        m.files.push(FileInfo {
            path: "s0000/t0002-000001.rows".into(),
            ..m.files[1].clone()
        });
        let data = m.encode().unwrap();
        let e = Manifest::decode("MANIFEST", &data.bytes).unwrap_err();
        assert!(matches!(e, CkptError::Corrupt { .. }), "{e}");
    }

    #[test]
    fn a_manifest_whose_file_sizes_overflow_still_sizes_and_renders() {
        let mut m = sample_manifest();
        m.files[0].size = u64::MAX;
        m.files[1].size = u64::MAX;
        let (m, _) = Manifest::decode("MANIFEST", &m.encode().unwrap().bytes).unwrap();
        assert_eq!(m.data_bytes(), u64::MAX);
        let l = Lineage::from_manifests([&m], None);
        assert!(l.render().contains(&u64::MAX.to_string()));
    }

    #[test]
    fn a_piece_part_whose_byte_length_overflows_is_refused() {
        let mut p = sample_piece(1);
        p.files[0].size = u64::MAX;
        p.chunks[0].rows = 1 << 62;
        p.chunks[0].parts[0] = Part {
            lo: 0,
            hi: 1 << 62,
            ids_at: 0,
            rows_at: 0,
            ..p.chunks[0].parts[0]
        };
        p.row0.clear();
        let e = PieceIndex::decode("s1/piece.pidx", &p.encode().unwrap().bytes).unwrap_err();
        assert!(matches!(e, CkptError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("does not fit"), "{e}");
    }

    #[test]
    fn an_empty_row_file_declaring_a_huge_row_is_refused() {
        let valid = valid_rows(0, 2, 1);
        let p = split(&valid);
        let mut head = p.head.clone();
        head[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        let e = RowChunk::decode("t.rows", &seal(&p.prefix, &head, &p.payload, None)).unwrap_err();
        assert!(e.to_string().contains("more than"), "{e}");
        let valid = valid_qrows(0, 2, QuantBits::Four);
        let p = split(&valid);
        let mut head = p.head.clone();
        head[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        let e =
            QRowChunk::decode("t.qrows", &seal(&p.prefix, &head, &p.payload, None)).unwrap_err();
        assert!(e.to_string().contains("more than"), "{e}");
    }

    #[test]
    fn retention_far_past_the_newest_step_keeps_one_full() {
        let newest = Manifest {
            step: u64::MAX,
            ..sample_manifest()
        };
        let older = Manifest {
            id: id("older"),
            step: u64::MAX - 1,
            ..sample_manifest()
        };
        let l = Lineage::from_manifests([&newest, &older], None);
        let live = l.live(&Retention {
            full_every_steps: u64::MAX,
            max_old_fulls: 2,
        });
        assert_eq!(live.into_iter().collect::<Vec<_>>(), vec![newest.id]);
    }
}
