//! Host bindings generated from the WIT contract in `sdk/wit/`.

wasmtime::component::bindgen!({
    path: "../sdk/wit",
    world: "plugin",
    exports: { default: async },
});
