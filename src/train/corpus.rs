//! The built-in demo corpus: short stories from a small grammar, generated deterministically so
//! `cargo run --release` trains on something with real structure (spelling, words, phrases)
//! without downloading anything. `assets/corpus.txt` is `generate(DEMO_SEED, DEMO_BYTES)`.

use crate::rng::Rng;

pub const DEMO_SEED: u64 = 2024;
pub const DEMO_BYTES: usize = 200_000;

/// The shipped corpus (the same text `generate(DEMO_SEED, DEMO_BYTES)` makes).
pub const DEMO: &str = include_str!("../../assets/corpus.txt");

const NAMES: &[&str] = &["Ada", "Ben", "Cleo", "Dara", "Emil", "Fern", "Gus", "Hana", "Ivo", "Juno", "Kai", "Lena"];
const ANIMALS: &[&str] = &["cat", "dog", "fox", "owl", "frog", "horse", "rabbit", "bird", "mouse", "bear"];
const THINGS: &[&str] = &["ball", "kite", "book", "boat", "cake", "lamp", "map", "drum", "hat", "key", "apple", "box"];
const PLACES: &[&str] =
    &["the park", "the river", "the garden", "the market", "the hill", "the forest", "the school", "the beach"];
const ADJECTIVES: &[&str] =
    &["red", "small", "happy", "old", "green", "quiet", "big", "shiny", "soft", "brave", "little", "blue"];
const FEELINGS: &[&str] = &["happy", "sad", "tired", "excited", "scared", "proud", "hungry", "sleepy"];
const VERBS: &[&str] = &["found", "lost", "saw", "liked", "wanted", "made", "took", "gave away", "painted", "carried"];
const TIMES: &[&str] =
    &["One day", "In the morning", "After lunch", "That night", "Later", "On Sunday", "Once upon a time"];

fn pick<'a>(rng: &mut Rng, words: &[&'a str]) -> &'a str {
    words[rng.below(words.len())]
}

fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

fn story(rng: &mut Rng) -> String {
    let hero = pick(rng, NAMES);
    let friend = pick(rng, NAMES);
    let animal = pick(rng, ANIMALS);
    let adj = pick(rng, ADJECTIVES);
    let thing = pick(rng, THINGS);
    let place = pick(rng, PLACES);
    let mut s = format!("{} {hero} went to {place} with {} {adj} {animal}. ", pick(rng, TIMES), article(adj));
    let sentences = 2 + rng.below(4);
    for _ in 0..sentences {
        let line = match rng.below(7) {
            0 => {
                let verb = pick(rng, VERBS);
                let what = pick(rng, ADJECTIVES);
                format!("{hero} {verb} {} {what} {thing}. ", article(what))
            }
            1 => format!("The {animal} was {} because it {} the {thing}. ", pick(rng, FEELINGS), pick(rng, VERBS)),
            2 => format!("\"Can I play with your {thing}?\" asked {friend}. "),
            3 => format!("{friend} said, \"I am {} today.\" ", pick(rng, FEELINGS)),
            4 => format!("They counted {} {thing}s near {}. ", 2 + rng.below(9), pick(rng, PLACES)),
            5 => format!("{hero} and {friend} ran to {} and back. ", pick(rng, PLACES)),
            _ => format!("The {} {} sat under a tree. ", pick(rng, ADJECTIVES), pick(rng, ANIMALS)),
        };
        s.push_str(&line);
    }
    s.push_str(&format!("At the end of the day, {hero} felt {}.\n\n", pick(rng, FEELINGS)));
    s
}

/// About `bytes` bytes of stories (whole stories, so slightly more), the same for a given seed.
pub fn generate(seed: u64, bytes: usize) -> String {
    let mut rng = Rng::new(seed);
    let mut text = String::with_capacity(bytes + 512);
    while text.len() < bytes {
        text.push_str(&story(&mut rng));
    }
    text
}
