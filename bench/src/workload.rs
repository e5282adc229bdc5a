//! What to send: per-request prompts, lengths and tenants, and when to send
//! (Poisson arrivals).

use crate::args::{Config, Endpoint};
use crate::lengths::LengthSpec;
use ballast_rng::SplitMix64;

/// Independent random streams, so that e.g. changing `--output-len` does not
/// change the prompts or the arrival times.
mod stream {
    pub const PREFIX: u64 = 1;
    pub const REQUEST: u64 = 2;
    pub const ARRIVALS: u64 = 3;
}

/// Common short English words. Real tokenizers map most of them (with their
/// leading space) to a single token, so a chat prompt of N words is roughly N
/// tokens; random letter strings would split into several tokens each.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "it", "that", "was", "for", "on", "are", "as", "with",
    "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but",
    "not", "what", "all", "were", "we", "when", "your", "can", "said", "there", "use", "an",
    "each", "which", "she", "do", "how", "their", "if", "will", "up", "other", "about", "out",
    "many", "then", "them", "these", "so", "some", "her", "would", "make", "like", "him", "into",
    "time", "has", "look", "two", "more", "write", "go", "see", "number", "no", "way", "could",
    "people", "my", "than", "first", "water", "been", "call", "who", "oil", "its", "now", "find",
    "long", "down", "day", "did", "get", "come", "made", "may", "part", "over", "new", "sound",
    "take", "only", "little", "work", "know", "place", "year", "live", "back", "give", "most",
    "very", "after", "thing", "our", "just", "name", "good", "man", "think", "say", "great",
    "where", "help", "through", "much", "before", "line", "right", "too", "mean", "old", "any",
    "same", "tell", "boy", "follow", "came", "want", "show", "also", "around", "form", "three",
    "small", "set", "put", "end", "does", "another", "well", "large", "must", "big", "even",
    "such", "because", "turn", "here", "why", "ask", "went", "men", "read", "need", "land",
];

/// The prompt of one request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Prompt {
    /// Token ids, for `/v1/completions` (exact length on any tokenizer).
    Tokens(Vec<u32>),
    /// Space-separated words, for `/v1/chat/completions`.
    Text(String),
}

/// Everything random about one request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RequestSpec {
    pub prompt: Prompt,
    /// Tokens (completions) or words (chat) in the prompt.
    pub input_len: u64,
    pub max_tokens: u64,
    pub tenant: Option<String>,
}

/// One unit of the shared prefix: a token id or a word index.
type Unit = u32;

/// Generates request `i` deterministically from the seed.
#[derive(Debug, Clone)]
pub(crate) struct Workload {
    seed: u64,
    endpoint: Endpoint,
    input: LengthSpec,
    output: LengthSpec,
    /// The shared prefixes (`--shared-prefixes` of them), each its own random stream.
    prefixes: Vec<Vec<Unit>>,
    prefix_ratio: f64,
    tenants: u64,
    token_range: (u32, u32),
}

impl Workload {
    pub(crate) fn new(config: &Config) -> Self {
        let mut w = Workload {
            seed: config.seed,
            endpoint: config.endpoint,
            input: config.input,
            output: config.output,
            prefixes: Vec::new(),
            prefix_ratio: config.shared_prefix_ratio,
            tenants: config.tenants,
            token_range: config.token_range,
        };
        w.prefixes = (0..config.shared_prefixes)
            .map(|k| {
                let mut rng = SplitMix64::derive_path(w.seed, &[stream::PREFIX, k]);
                (0..config.shared_prefix_len)
                    .map(|_| w.unit(&mut rng))
                    .collect()
            })
            .collect();
        w
    }

    fn unit(&self, rng: &mut SplitMix64) -> Unit {
        match self.endpoint {
            Endpoint::Completions => {
                let (lo, hi) = self.token_range;
                lo + rng.below(u64::from(hi - lo)) as u32
            }
            Endpoint::Chat => rng.below(WORDS.len() as u64) as u32,
        }
    }

    /// Request number `index` of the run.
    pub(crate) fn request(&self, index: u64) -> RequestSpec {
        let mut rng = SplitMix64::derive_path(self.seed, &[stream::REQUEST, index]);
        let input_len = self.input.sample(&mut rng);
        let max_tokens = self.output.sample(&mut rng);
        // `next_f64() < 1.0` always holds, so ratio 1.0 means every request.
        let has_prefix = self.prefixes.first().is_some_and(|p| !p.is_empty());
        let shared = has_prefix && rng.next_f64() < self.prefix_ratio;
        let tenant = (self.tenants > 0).then(|| format!("tenant-{}", rng.below(self.tenants)));

        let len = input_len as usize;
        let mut units: Vec<Unit> = Vec::with_capacity(len);
        if shared {
            // Drawn only when there is a choice, so one prefix keeps the workloads of old.
            let k = match self.prefixes.len() {
                1 => 0,
                n => rng.below(n as u64) as usize,
            };
            units.extend(self.prefixes[k].iter().take(len));
        }
        while units.len() < len {
            units.push(self.unit(&mut rng));
        }
        let prompt = match self.endpoint {
            Endpoint::Completions => Prompt::Tokens(units),
            Endpoint::Chat => {
                let words: Vec<&str> = units.iter().map(|&u| WORDS[u as usize]).collect();
                Prompt::Text(words.join(" "))
            }
        };
        RequestSpec {
            prompt,
            input_len,
            max_tokens,
            tenant,
        }
    }
}

/// Poisson arrival process: exponential gaps with mean `1 / rate`.
#[derive(Debug, Clone)]
pub(crate) struct Arrivals {
    rng: SplitMix64,
    rate: f64,
}

impl Arrivals {
    pub(crate) fn new(seed: u64, rate: f64) -> Self {
        Arrivals {
            rng: SplitMix64::derive_path(seed, &[stream::ARRIVALS, 0]),
            rate,
        }
    }

    /// Seconds until the next arrival.
    pub(crate) fn next_gap(&mut self) -> f64 {
        self.rng.exponential(1.0 / self.rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::BenchArgs;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn workload(extra: &[&str]) -> Workload {
        let argv = std::iter::once("bench").chain(extra.iter().copied());
        let args = Cli::try_parse_from(argv).unwrap().args;
        Workload::new(&Config::from_args(args).unwrap())
    }

    fn tokens(spec: &RequestSpec) -> &[u32] {
        match &spec.prompt {
            Prompt::Tokens(t) => t,
            Prompt::Text(_) => panic!("expected token prompt"),
        }
    }

    #[test]
    fn poisson_gaps_average_one_over_rate() {
        for rate in [0.5, 4.0, 200.0] {
            let mut a = Arrivals::new(11, rate);
            let n = 100_000;
            let mean = (0..n).map(|_| a.next_gap()).sum::<f64>() / n as f64;
            let want = 1.0 / rate;
            assert!(
                (mean - want).abs() < 0.02 * want,
                "rate {rate}: mean gap {mean}, want {want}"
            );
        }
    }

    #[test]
    fn completion_prompts_have_exact_lengths_and_ids_in_range() {
        let w = workload(&[
            "--input-len",
            "uniform:1:300",
            "--output-len",
            "exp:20",
            "--token-range",
            "1000:1010",
        ]);
        for i in 0..500 {
            let r = w.request(i);
            let t = tokens(&r);
            assert_eq!(t.len() as u64, r.input_len);
            assert!((1..=300).contains(&r.input_len));
            assert!(r.max_tokens >= 1);
            assert!(t.iter().all(|&id| (1000..1010).contains(&id)), "{t:?}");
            assert_eq!(r.tenant, None);
        }
    }

    #[test]
    fn requests_are_deterministic_per_seed_and_index() {
        let a = workload(&["--input-len", "normal:50:10", "--seed", "5"]);
        let b = workload(&["--input-len", "normal:50:10", "--seed", "5"]);
        let c = workload(&["--input-len", "normal:50:10", "--seed", "6"]);
        assert_eq!(a.request(17), b.request(17));
        assert_ne!(a.request(17), a.request(18));
        assert_ne!(a.request(17), c.request(17));
    }

    #[test]
    fn shared_prefix_is_identical_and_the_rest_varies() {
        let w = workload(&["--input-len", "40", "--shared-prefix-len", "16"]);
        let first = w.request(0);
        let prefix = &tokens(&first)[..16];
        for i in 1..50 {
            let r = w.request(i);
            let t = tokens(&r);
            assert_eq!(t.len(), 40);
            assert_eq!(&t[..16], prefix, "request {i} lost the prefix");
        }
        // The suffixes come from each request's own stream.
        assert_ne!(tokens(&w.request(1))[16..], tokens(&w.request(2))[16..]);
    }

    #[test]
    fn several_shared_prefixes_are_drawn_evenly_and_differ() {
        let w = workload(&[
            "--input-len",
            "24",
            "--shared-prefix-len",
            "16",
            "--shared-prefixes",
            "8",
        ]);
        let one = workload(&["--input-len", "24", "--shared-prefix-len", "16"]);
        assert_eq!(w.prefixes.len(), 8);
        assert_eq!(
            w.prefixes[0], one.prefixes[0],
            "the first is the one prefix of old"
        );
        let mut seen = [0usize; 8];
        for i in 0..4000 {
            let r = w.request(i);
            let k = w
                .prefixes
                .iter()
                .position(|p| tokens(&r)[..16] == p[..])
                .expect("every request carries one of the prefixes");
            seen[k] += 1;
        }
        assert!(seen.iter().all(|&n| (400..600).contains(&n)), "{seen:?}");
        // One prefix draws nothing: the requests are those of before the flag.
        assert_eq!(
            one.request(5),
            workload(&[
                "--input-len",
                "24",
                "--shared-prefix-len",
                "16",
                "--shared-prefixes",
                "1"
            ])
            .request(5)
        );
    }

    #[test]
    fn prefix_longer_than_input_is_truncated() {
        let w = workload(&["--input-len", "5", "--shared-prefix-len", "20"]);
        let long = workload(&["--input-len", "30", "--shared-prefix-len", "20"]);
        let t = tokens(&w.request(3)).to_vec();
        assert_eq!(t.len(), 5);
        assert_eq!(t[..], tokens(&long.request(9))[..5]);
    }

    #[test]
    fn shared_prefix_ratio_is_roughly_respected() {
        let w = workload(&[
            "--input-len",
            "12",
            "--shared-prefix-len",
            "8",
            "--shared-prefix-ratio",
            "0.3",
        ]);
        let prefix = w.prefixes[0].clone();
        let n = 10_000;
        let with = (0..n)
            .filter(|&i| tokens(&w.request(i))[..8] == prefix[..])
            .count();
        let frac = with as f64 / n as f64;
        assert!((frac - 0.3).abs() < 0.03, "fraction with prefix {frac}");

        let none = workload(&[
            "--input-len",
            "12",
            "--shared-prefix-len",
            "8",
            "--shared-prefix-ratio",
            "0",
        ]);
        assert!((0..200).all(|i| tokens(&none.request(i))[..8] != none.prefixes[0][..]));
    }

    #[test]
    fn chat_prompts_have_input_len_words_and_shared_prefix() {
        let w = workload(&[
            "--endpoint",
            "chat",
            "--input-len",
            "uniform:10:30",
            "--shared-prefix-len",
            "6",
        ]);
        let text_of = |i| match w.request(i).prompt {
            Prompt::Text(t) => t,
            Prompt::Tokens(_) => panic!("expected text"),
        };
        let head: Vec<String> = text_of(0).split(' ').take(6).map(String::from).collect();
        for i in 0..100 {
            let r = w.request(i);
            let text = text_of(i);
            let words: Vec<&str> = text.split(' ').collect();
            assert_eq!(words.len() as u64, r.input_len);
            assert!(
                words
                    .iter()
                    .all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase()))
            );
            assert_eq!(words[..6], head[..]);
        }
    }

    #[test]
    fn tenants_are_uniform_over_k() {
        let w = workload(&["--tenants", "3"]);
        let mut counts = [0usize; 3];
        for i in 0..3_000 {
            let t = w.request(i).tenant.expect("tenant set");
            let k: usize = t.strip_prefix("tenant-").unwrap().parse().unwrap();
            counts[k] += 1;
        }
        assert!(
            counts.iter().all(|&c| (850..1150).contains(&c)),
            "{counts:?}"
        );
    }
}
