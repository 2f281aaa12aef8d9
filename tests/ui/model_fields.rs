#[lmx::model]
pub struct Bad {
    #[lmx(role = weight)]
    proj: lmx::runtime::nn::LinearParams,
    scales: Vec<lmx::runtime::Array>,
    #[lmx(role = gain)]
    gain: lmx::runtime::Array,
    #[lmx(tied = "proj.0")]
    head: lmx::runtime::nn::LinearParams,
    #[lmx(shared)]
    other: lmx::runtime::nn::LinearParams,
}

fn main() {}
