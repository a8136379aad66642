//! What a person's side needs to know of a tool ([`Runtime::tool_info`]): the inbox and the
//! agent server's status fill their waiting calls with it.

use super::Runtime;
use crate::definition::Approval;
use crate::types::inbox::ToolInfo;

impl Runtime {
    /// The description, schemas and approval of `agent`'s tool `tool`, as a page needs them
    /// to show a call of it and answer it; `None` if no agent of that name is defined here
    /// or it has no such tool (a remote sub-agent's, say).
    ///
    /// ```
    /// # fn demo(runtime: dormant::Runtime) {
    /// if let Some(tool) = runtime.tool_info("editor", "publish") {
    ///     println!("{:?} (edits allowed: {})", tool.description, tool.editable);
    /// }
    /// # }
    /// ```
    pub fn tool_info(&self, agent: &str, tool: &str) -> Option<ToolInfo> {
        let definition = self.inner.shared.agents.get(agent)?;
        let def = &definition.tool(tool)?.def;
        Some(ToolInfo {
            // An empty description says nothing: absent rather than blank.
            description: Some(def.description.clone()).filter(|text| !text.is_empty()),
            input_schema: def.input_schema.clone(),
            output_schema: def.output_schema.clone(),
            editable: matches!(def.approval, Approval::Editable),
        })
    }
}
