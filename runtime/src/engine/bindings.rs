//! Host bindings generated from the WIT contract in `sdk/wit/`.

wasmtime::component::bindgen!({
    path: "../sdk/wit",
    world: "plugin",
    imports: { "sonde:probe/exec.run": async, "sonde:probe/http.send": async, "sonde:probe/grpc.call": async },
    exports: { default: async },
});
