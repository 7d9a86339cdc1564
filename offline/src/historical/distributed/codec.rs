//! The physical codec of a Quiver cluster: Ballista's own operators (shuffles) as
//! Ballista encodes them, and Quiver's [`AsOfJoinExec`] as JSON behind a marker no
//! protobuf message starts with. The client, the scheduler and every
//! executor must use it (`quiver cluster` starts them so).

use std::sync::Arc;

use ballista_core::serde::BallistaPhysicalExtensionCodec;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use serde::{Deserialize, Serialize};

use super::exec::{AsOfJoinExec, JoinTask};

/// Marks Quiver's nodes: a first byte 0xff would be a protobuf field tag with its
/// continuation bit set and no field number Ballista uses.
const MARKER: &[u8] = b"\xffquiver1:";

#[derive(Serialize, Deserialize)]
enum Node {
    AsOfJoin(JoinTask),
}

/// Encodes and decodes Quiver's cluster operators, and Ballista's through Ballista.
#[derive(Debug, Default)]
pub struct QuiverCodec {
    ballista: BallistaPhysicalExtensionCodec,
}

fn codec_error(message: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Internal(format!("quiver codec: {message}"))
}

impl PhysicalExtensionCodec for QuiverCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let Some(json) = buf.strip_prefix(MARKER) else {
            return self.ballista.try_decode(buf, inputs, ctx, proto_converter);
        };
        let node: Node = serde_json::from_slice(json).map_err(codec_error)?;
        match (node, inputs) {
            (Node::AsOfJoin(task), [spine, rows]) => Ok(Arc::new(AsOfJoinExec::try_new(Arc::new(task), spine.clone(), rows.clone())?)),
            (_, inputs) => Err(codec_error(format!("a node with {} inputs does not decode", inputs.len()))),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<()> {
        let ours = if let Some(join) = node.downcast_ref::<AsOfJoinExec>() {
            Node::AsOfJoin(join.task.as_ref().clone())
        } else {
            return self.ballista.try_encode(node, buf, proto_converter);
        };
        buf.extend_from_slice(MARKER);
        serde_json::to_writer(buf, &ours).map_err(codec_error)
    }
}
