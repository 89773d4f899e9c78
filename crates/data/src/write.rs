//! Writing synthetic data as Criteo Kaggle-layout TSV (`ftrec data synth`).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use ftrec_core::Preset;

use crate::error::DataError;
use crate::synth::{Split, SyntheticSource};

/// File name `synth_to_dir` writes, which the Kaggle layout reads from a directory.
pub const SYNTH_FILE: &str = "train.tsv";

/// Write samples `range` of `split` as TSV lines to `out`, streaming (one line buffer).
pub fn write_tsv<W: Write>(
    src: &SyntheticSource,
    split: Split,
    range: Range<u64>,
    mut out: W,
) -> std::io::Result<()> {
    let mut line = Vec::with_capacity(512);
    for i in range {
        line.clear();
        src.sample(split, i).0.write_tsv_line(&mut line);
        out.write_all(&line)?;
    }
    out.flush()
}

/// Write the first `samples` training samples of the synthetic stream for `preset` and `seed`
/// to `out_dir/train.tsv` (creating the directory). The file appears whole or not at all: it
/// is written under a temporary name, synced and renamed. Returns the file's path.
pub fn synth_to_dir(
    preset: &Preset,
    seed: u64,
    samples: u64,
    out_dir: &Path,
) -> Result<PathBuf, DataError> {
    let src = SyntheticSource::from_preset(preset, seed)?;
    std::fs::create_dir_all(out_dir).map_err(|e| DataError::io(out_dir, e))?;
    let path = out_dir.join(SYNTH_FILE);
    let tmp = out_dir.join(format!("{SYNTH_FILE}.tmp"));
    let result = (|| {
        let file = File::create(&tmp)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        write_tsv(&src, Split::Train, 0..samples, &mut w)?;
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(DataError::io(&path, e));
    }
    Ok(path)
}
