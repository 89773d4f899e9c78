//! Compiles `proto/ps.proto` with protox (pure Rust, so no `protoc` is needed) and generates the
//! tonic client and server stubs from the resulting descriptor set.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/ps.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
