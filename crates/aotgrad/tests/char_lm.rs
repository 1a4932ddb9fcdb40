//! The causal character-level language model example (`examples/char_lm.rs`), run
//! short: the compiled training lowers the loss, and `multinomial` samples text over
//! the corpus's characters.

#[path = "../examples/char_lm.rs"]
mod char_lm;

#[test]
fn the_char_lm_example_trains_and_samples() {
    let run = char_lm::run(60, 40, false).expect("the example runs");
    let (first, last) = (run.losses[0].1, run.losses.last().unwrap().1);
    assert!(last < 0.7 * first, "the loss fell from {first} to only {last}: {:?}", run.losses);
    assert_eq!(run.sample.chars().count(), "the cat".len() + 40);
    assert!(run.sample.starts_with("the cat"));
    assert!(run.sample.chars().all(|c| run.vocabulary.contains(&c)), "{}", run.sample);
}
