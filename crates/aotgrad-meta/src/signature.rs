//! [`GraphSignature`]: what each input and output of an exported graph stands for.
//!
//! An exported graph takes its inputs in the order parameters, buffers, user inputs,
//! and returns, in order: the new values of mutated buffers, the user outputs (one of
//! which may be the loss), then — for a joint graph — the gradients of the parameters
//! and of the user inputs that require grad. The signature names every position, so
//! whoever runs the graph can feed the right tensors and write the mutated buffers back.

use aotgrad_ir::ValueId;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What one graph input is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InputSpecKind {
    /// The module parameter with this fully qualified name.
    Parameter(String),
    /// The module buffer with this fully qualified name.
    Buffer(String),
    /// User input number `0` (in the order the caller passes them).
    UserInput(usize),
}

/// One graph input.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputSpec {
    /// The graph input's name (as printed in the graph).
    pub name: String,
    /// What it stands for.
    pub kind: InputSpecKind,
}

/// What one graph output is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutputSpecKind {
    /// The new value of the buffer with this name: the caller copies it into the buffer.
    BufferMutation(String),
    /// User output number `0` (in the order the module returns them).
    UserOutput(usize),
    /// The gradient of the loss with respect to this parameter.
    GradientToParameter(String),
    /// The gradient of the loss with respect to user input number `0`.
    GradientToUserInput(usize),
}

/// One graph output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputSpec {
    /// The graph value returned at this position.
    pub value: ValueId,
    /// What it stands for.
    pub kind: OutputSpecKind,
}

/// The exported description of a graph's inputs and outputs (one spec per position).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphSignature {
    /// One entry per graph input, in order.
    pub inputs: Vec<InputSpec>,
    /// One entry per graph output, in order.
    pub outputs: Vec<OutputSpec>,
    /// The user output that is the loss (an index into the user outputs), when the
    /// graph is a joint graph.
    pub loss_output: Option<usize>,
}

impl GraphSignature {
    /// Parameter names, in graph-input order.
    pub fn parameters(&self) -> Vec<&str> {
        self.inputs
            .iter()
            .filter_map(|i| match &i.kind {
                InputSpecKind::Parameter(n) => Some(n.as_str()),
                _ => None,
            })
            .collect()
    }
    /// Buffer names, in graph-input order.
    pub fn buffers(&self) -> Vec<&str> {
        self.inputs
            .iter()
            .filter_map(|i| match &i.kind {
                InputSpecKind::Buffer(n) => Some(n.as_str()),
                _ => None,
            })
            .collect()
    }
    /// Graph-input positions of the user inputs, in user order.
    pub fn user_inputs(&self) -> Vec<usize> {
        self.positions_in(&self.inputs, |i| matches!(i.kind, InputSpecKind::UserInput(_)))
    }
    /// Graph-output positions of the user outputs, in user order.
    pub fn user_outputs(&self) -> Vec<usize> {
        self.positions_in(&self.outputs, |o| matches!(o.kind, OutputSpecKind::UserOutput(_)))
    }
    /// `(graph output position, buffer name)` for every mutated buffer.
    pub fn buffers_to_mutate(&self) -> Vec<(usize, &str)> {
        self.outputs
            .iter()
            .enumerate()
            .filter_map(|(p, o)| match &o.kind {
                OutputSpecKind::BufferMutation(n) => Some((p, n.as_str())),
                _ => None,
            })
            .collect()
    }
    /// `(graph output position, parameter name)` for every parameter gradient.
    pub fn gradients_to_parameters(&self) -> Vec<(usize, &str)> {
        self.outputs
            .iter()
            .enumerate()
            .filter_map(|(p, o)| match &o.kind {
                OutputSpecKind::GradientToParameter(n) => Some((p, n.as_str())),
                _ => None,
            })
            .collect()
    }
    /// `(graph output position, user input index)` for every user-input gradient.
    pub fn gradients_to_user_inputs(&self) -> Vec<(usize, usize)> {
        self.outputs
            .iter()
            .enumerate()
            .filter_map(|(p, o)| match &o.kind {
                OutputSpecKind::GradientToUserInput(i) => Some((p, *i)),
                _ => None,
            })
            .collect()
    }
    /// The graph-output position of the loss, if any.
    pub fn loss_output_position(&self) -> Option<usize> {
        let loss = self.loss_output?;
        self.outputs.iter().position(|o| o.kind == OutputSpecKind::UserOutput(loss))
    }

    fn positions_in<T>(&self, items: &[T], pred: impl Fn(&T) -> bool) -> Vec<usize> {
        items.iter().enumerate().filter(|(_, x)| pred(x)).map(|(p, _)| p).collect()
    }
}

impl fmt::Display for InputSpecKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputSpecKind::Parameter(n) => write!(f, "parameter {n}"),
            InputSpecKind::Buffer(n) => write!(f, "buffer {n}"),
            InputSpecKind::UserInput(i) => write!(f, "user input {i}"),
        }
    }
}

impl fmt::Display for OutputSpecKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutputSpecKind::BufferMutation(n) => write!(f, "mutated buffer {n}"),
            OutputSpecKind::UserOutput(i) => write!(f, "user output {i}"),
            OutputSpecKind::GradientToParameter(n) => write!(f, "gradient of parameter {n}"),
            OutputSpecKind::GradientToUserInput(i) => write!(f, "gradient of user input {i}"),
        }
    }
}

/// One line per input and output:
///
/// ```text
/// inputs:
///   0 "fc.weight": parameter fc.weight
///   1 "arg0": user input 0
/// outputs:
///   0 %7: user output 0 (loss)
///   1 %12: gradient of parameter fc.weight
/// ```
impl fmt::Display for GraphSignature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "inputs:")?;
        for (p, i) in self.inputs.iter().enumerate() {
            writeln!(f, "  {p} {:?}: {}", i.name, i.kind)?;
        }
        writeln!(f, "outputs:")?;
        for (p, o) in self.outputs.iter().enumerate() {
            let loss = matches!(o.kind, OutputSpecKind::UserOutput(i) if Some(i) == self.loss_output);
            writeln!(f, "  {p} {}: {}{}", o.value, o.kind, if loss { " (loss)" } else { "" })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig() -> GraphSignature {
        GraphSignature {
            inputs: vec![
                InputSpec { name: "w".into(), kind: InputSpecKind::Parameter("w".into()) },
                InputSpec { name: "rm".into(), kind: InputSpecKind::Buffer("rm".into()) },
                InputSpec { name: "arg0".into(), kind: InputSpecKind::UserInput(0) },
            ],
            outputs: vec![
                OutputSpec { value: ValueId(5), kind: OutputSpecKind::BufferMutation("rm".into()) },
                OutputSpec { value: ValueId(7), kind: OutputSpecKind::UserOutput(0) },
                OutputSpec { value: ValueId(9), kind: OutputSpecKind::UserOutput(1) },
                OutputSpec { value: ValueId(11), kind: OutputSpecKind::GradientToParameter("w".into()) },
            ],
            loss_output: Some(1),
        }
    }

    #[test]
    fn accessors_name_positions() {
        let s = sig();
        assert_eq!(s.parameters(), vec!["w"]);
        assert_eq!(s.buffers(), vec!["rm"]);
        assert_eq!(s.user_inputs(), vec![2]);
        assert_eq!(s.user_outputs(), vec![1, 2]);
        assert_eq!(s.buffers_to_mutate(), vec![(0, "rm")]);
        assert_eq!(s.gradients_to_parameters(), vec![(3, "w")]);
        assert!(s.gradients_to_user_inputs().is_empty());
        assert_eq!(s.loss_output_position(), Some(2));
    }

    #[test]
    fn display_lists_every_position() {
        let text = sig().to_string();
        assert_eq!(
            text,
            "inputs:\n  0 \"w\": parameter w\n  1 \"rm\": buffer rm\n  2 \"arg0\": user input 0\noutputs:\n  \
             0 %5: mutated buffer rm\n  1 %7: user output 0\n  2 %9: user output 1 (loss)\n  \
             3 %11: gradient of parameter w\n"
        );
    }
}
