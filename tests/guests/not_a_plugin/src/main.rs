//! A wasi:cli command, not a sonde plugin: a component of another world.

fn main() {
    println!("hello");
}
