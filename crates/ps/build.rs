//! Compiles every `proto/*.proto` with protox (pure Rust, so no `protoc` is needed) and
//! generates the tonic client and server stubs from the resulting descriptor set.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let mut protos: Vec<String> = std::fs::read_dir("proto")?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    protos.sort();
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let descriptors = protox::compile(&protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // A rebuild's reads are the bulk of what a replacement receives: their rows stay in
        // the buffer they arrived in until they are decoded, and a survivor hands its rows
        // to the encoder as they are.
        .bytes(".ftrec.ec.v1.ReadMembersReply.data")
        // The transactions' shares and the peers' delta batches: their gradients and deltas
        // are read from the buffer they arrived in (decoded once, into floats), and a batch's
        // floats are sent from the buffer they were computed in.
        .bytes(".ftrec.ec.v1.TxnUpdate")
        .bytes(".ftrec.ec.v1.DeltaBatch")
        .compile_fds(descriptors)?;
    Ok(())
}
