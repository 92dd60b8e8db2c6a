//! Host bindings generated from the WIT contract in `sdk/wit/`.

wasmtime::component::bindgen!({
    path: "../sdk/wit",
    world: "plugin",
    imports: {
        "sonde:probe/exec.run": async,
        "sonde:probe/http.send": async,
        "sonde:probe/grpc.call": async,
        "sonde:probe/tls.handshake": async,
        "sonde:probe/tls.connect": async,
        "sonde:probe/tcp.connect": async,
        "sonde:probe/tls.[method]session.send": async,
        "sonde:probe/tls.[method]session.receive": async,
    },
    with: { "sonde:probe/tls.session": crate::host::handshake::Session },
    exports: { default: async },
});
