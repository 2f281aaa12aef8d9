#[lmx::model]
pub struct Generic<T> {
    leaf: T,
}

fn main() {}
