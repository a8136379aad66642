//! What every session does: its agent and script, where it suspends, and how its simulated
//! client behaves at each suspension. Everything here is a pure function of the arguments,
//! the seed, the session index and the suspension index, so a run is reproducible whatever
//! order the scheduler happens to run things in.

use dormant::{ModelReply, ToolCall};
use serde_json::{json, Value};

use crate::Args;

/// The server tool of the plain steps.
pub(crate) const LOOKUP: &str = "lookup";
/// The client tool (answered by the simulated client, checked against an output schema).
pub(crate) const CONFIRM: &str = "confirm";
/// The approval-gated server tool.
pub(crate) const DEPLOY: &str = "deploy";
/// The two agents: identical tools, mirrored scripts. Sessions alternate between them so that
/// every suspension index is a client call in half the sessions and an approval in the other.
pub(crate) const AGENTS: [&str; 2] = ["simulated", "simulated-mirrored"];
/// What a timed-out call's error result starts with.
pub(crate) const TIMEOUT_CODE: &str = "client_tool_timeout";

/// Which kind of human-in-the-loop call a suspension makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A call of the client tool `confirm`: the client submits its result.
    Client,
    /// A call of the approval-gated `deploy`: a person approves it, then it runs on resume.
    Approval,
}

/// One model reply of a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A call of the server tool `lookup` (step index within the turn).
    Server(usize),
    /// A suspension (its index within the session, 0-based).
    Suspend(usize),
    /// The turn's final text.
    Text,
}

/// How the simulated client treats one suspension.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Behaviour {
    /// Never answers: the call times out.
    pub(crate) never_answer: bool,
    /// Submits the same answer a second time (which must be `already_completed`).
    pub(crate) duplicate: bool,
    /// Sends the duplicate after the resume (the tombstone answers it) rather than before.
    pub(crate) duplicate_after_resume: bool,
    /// First sends the wrong kind of answer (which must be `invalid_result`).
    pub(crate) wrong_kind: bool,
    /// The driver evicts the session right after it suspends.
    pub(crate) evict: bool,
    /// How long the client takes to answer, in milliseconds.
    pub(crate) delay_ms: u64,
    /// Makes every client result distinct, so the end check can tell answers apart.
    pub(crate) token: u64,
}

/// The shape of the workload.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) steps: usize,
    pub(crate) turns: usize,
    pub(crate) suspensions: usize,
    seed: u64,
    never_answer: f64,
    duplicates: f64,
    wrong_kind: f64,
    evict_waiting: f64,
    answer_delay_ms: u64,
}

impl Plan {
    pub(crate) fn new(args: &Args) -> Self {
        Self {
            steps: args.steps,
            turns: args.turns,
            suspensions: args.suspensions,
            seed: args.seed,
            never_answer: args.never_answer,
            duplicates: args.duplicates,
            wrong_kind: args.wrong_kind,
            evict_waiting: args.evict_waiting,
            answer_delay_ms: args.answer_delay_ms,
        }
    }

    /// The agent session `session` runs.
    pub(crate) fn agent(session: usize) -> &'static str {
        AGENTS[session % 2]
    }

    /// Whether suspension `index` of session `session` is a client call or an approval.
    pub(crate) fn kind(session: usize, index: usize) -> Kind {
        Self::kind_for_agent(session % 2, index)
    }

    fn kind_for_agent(agent: usize, index: usize) -> Kind {
        if (agent + index) % 2 == 0 {
            Kind::Client
        } else {
            Kind::Approval
        }
    }

    /// The suspensions of turn `turn` (1-based): every `turns`-th, round robin.
    pub(crate) fn suspensions_in_turn(&self, turn: usize) -> Vec<usize> {
        (0..self.suspensions)
            .filter(|index| index % self.turns == turn - 1)
            .collect()
    }

    /// The model replies of turn `turn`, in order: the server steps with the turn's
    /// suspensions spread evenly among them, then the final text.
    pub(crate) fn turn_replies(&self, turn: usize) -> Vec<Reply> {
        let suspensions = self.suspensions_in_turn(turn);
        let count = suspensions.len();
        let mut replies = Vec::with_capacity(self.steps + count + 1);
        let mut step = 0;
        for (i, index) in suspensions.into_iter().enumerate() {
            let before = (i + 1) * self.steps / (count + 1);
            while step < before {
                replies.push(Reply::Server(step));
                step += 1;
            }
            replies.push(Reply::Suspend(index));
        }
        while step < self.steps {
            replies.push(Reply::Server(step));
            step += 1;
        }
        replies.push(Reply::Text);
        replies
    }

    /// The script of agent `AGENTS[agent]`: every turn's replies, in order. The scripted model
    /// answers with entry k where k counts the session's assistant messages.
    pub(crate) fn script(&self, agent: usize) -> Vec<ModelReply> {
        let mut script = Vec::new();
        for turn in 1..=self.turns {
            for reply in self.turn_replies(turn) {
                script.push(match reply {
                    Reply::Server(step) => ModelReply::tool_calls(vec![ToolCall::new(
                        server_call_id(turn, step),
                        LOOKUP,
                        json!({ "item": "tea", "step": step }),
                    )]),
                    Reply::Suspend(index) => {
                        let call = suspension_call_id(turn, index);
                        ModelReply::tool_calls(vec![match Self::kind_for_agent(agent, index) {
                            Kind::Client => ToolCall::new(
                                call,
                                CONFIRM,
                                json!({ "question": "proceed?", "suspension": index }),
                            ),
                            Kind::Approval => ToolCall::new(
                                call,
                                DEPLOY,
                                json!({ "env": "prod", "suspension": index }),
                            ),
                        }])
                    }
                    Reply::Text => ModelReply::text(format!("turn {turn}: we have 3 teas.")),
                });
            }
        }
        script
    }

    /// Model calls a turn may make: its steps, its suspensions and the final text. A resume
    /// continues the turn's step count, so this bounds every run of the turn.
    pub(crate) fn max_steps(&self) -> usize {
        let most = (1..=self.turns)
            .map(|turn| self.suspensions_in_turn(turn).len())
            .max()
            .unwrap_or(0);
        self.steps + most + 1
    }

    /// How the client treats suspension `index` of session `session`.
    pub(crate) fn behaviour(&self, session: usize, index: usize) -> Behaviour {
        let mut rng = Rng::new(self.seed, count(session), count(index));
        let never_answer = rng.chance(self.never_answer);
        let duplicate = rng.chance(self.duplicates);
        let duplicate_after_resume = rng.chance(0.5);
        let wrong_kind = rng.chance(self.wrong_kind);
        let evict = rng.chance(self.evict_waiting);
        let delay_ms = rng.below(self.answer_delay_ms.saturating_add(1));
        let token = rng.below(1 << 48);
        Behaviour {
            never_answer,
            duplicate: duplicate && !never_answer,
            duplicate_after_resume,
            wrong_kind: wrong_kind && !never_answer,
            evict,
            delay_ms,
            token,
        }
    }
}

/// The id of server step `step` of turn `turn`.
pub(crate) fn server_call_id(turn: usize, step: usize) -> String {
    format!("t{turn}-c{step}")
}

/// The id of suspension `index`, which happens in turn `turn`.
pub(crate) fn suspension_call_id(turn: usize, index: usize) -> String {
    format!("t{turn}-s{index}")
}

/// What the client submits for a `confirm` call.
pub(crate) fn confirm_result(token: u64) -> Value {
    json!({ "confirmed": true, "token": token })
}

/// The output schema of `confirm`.
pub(crate) fn confirm_schema() -> Value {
    json!({
        "type": "object",
        "required": ["confirmed", "token"],
        "properties": {
            "confirmed": { "type": "boolean" },
            "token": { "type": "integer", "minimum": 0 }
        },
        "additionalProperties": false
    })
}

/// What `deploy` returns when it runs with `input`.
pub(crate) fn deploy_result(input: &Value) -> Value {
    json!({ "deployed": input["env"], "suspension": input["suspension"] })
}

/// The input the script gives `deploy` at suspension `index`.
pub(crate) fn deploy_input(index: usize) -> Value {
    json!({ "env": "prod", "suspension": index })
}

/// What `lookup` returns at step `step`.
pub(crate) fn lookup_result(step: &Value) -> Value {
    json!({ "found": true, "step": step, "stock": 3 })
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// A small seeded generator (splitmix64): reproducible, good enough for choosing behaviours.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64, a: u64, b: u64) -> Self {
        let mut rng = Rng(seed);
        let first = rng.next_u64() ^ a.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        rng.0 = first;
        let second = rng.next_u64() ^ b.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        rng.0 = second;
        rng
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    #[allow(clippy::cast_precision_loss)]
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub(crate) fn chance(&mut self, probability: f64) -> bool {
        self.unit() < probability
    }

    /// Uniform in `[0, bound)` (0 when `bound` is 0).
    pub(crate) fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            0
        } else {
            self.next_u64() % bound
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suspensions_spread_over_turns_and_steps() {
        let plan = Plan {
            steps: 4,
            turns: 2,
            suspensions: 3,
            seed: 1,
            never_answer: 0.0,
            duplicates: 0.0,
            wrong_kind: 0.0,
            evict_waiting: 0.0,
            answer_delay_ms: 0,
        };
        assert_eq!(plan.suspensions_in_turn(1), vec![0, 2]);
        assert_eq!(plan.suspensions_in_turn(2), vec![1]);
        assert_eq!(
            plan.turn_replies(1),
            vec![
                Reply::Server(0),
                Reply::Suspend(0),
                Reply::Server(1),
                Reply::Suspend(2),
                Reply::Server(2),
                Reply::Server(3),
                Reply::Text
            ]
        );
        assert_eq!(
            plan.turn_replies(2),
            vec![
                Reply::Server(0),
                Reply::Server(1),
                Reply::Suspend(1),
                Reply::Server(2),
                Reply::Server(3),
                Reply::Text
            ]
        );
        assert_eq!(plan.max_steps(), 7);
        assert_eq!(plan.script(0).len(), 7 + 6);
        assert_eq!(Plan::kind(0, 0), Kind::Client);
        assert_eq!(Plan::kind(1, 0), Kind::Approval);
        assert_eq!(Plan::kind(1, 1), Kind::Client);
    }
}
