//! `Action::as_str` is the serde form, word for word, for every action.

use ballast_crds::Action;

#[test]
fn action_words_are_the_serde_form() {
    let all = [
        Action::ScaleUp,
        Action::ScaleDown,
        Action::Rebalance,
        Action::Hold,
    ];
    for a in all {
        let serde = serde_json::to_value(a).unwrap();
        assert_eq!(serde, serde_json::Value::from(a.as_str()), "{a:?}");
        assert_eq!(a.to_string(), a.as_str());
        let back: Action = serde_json::from_value(serde).unwrap();
        assert_eq!(back, a);
    }
    let words: Vec<_> = all.iter().map(|a| a.as_str()).collect();
    assert_eq!(words, ["ScaleUp", "ScaleDown", "Rebalance", "Hold"]);
}
