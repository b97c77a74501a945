"""Infer stage: predictions and embeddings of every node, computed layer by layer over all partitions.

- ``stage``: the stage module (``Params``, ``run``, ``report``): launches one rank per partition
  (``stages.jobs.launcher``), then exports the ranks' per-partition outputs in orig-id order (``storage.infer``);
  ``export_units``: those exports as units of ``stages.executor``.
- ``params``: its parameters (torch-free); ``spec``: what the stage hands the ranks; ``worker``: one rank's entry
  point (``python -m stages.infer.worker --spec``); ``rank``: what a rank reads and writes; ``layerwise``: the
  computation (chunks, blocks, the exchange of a layer's rows, the plain-model fallback, the device a GPU rank's
  steps run on); ``layer_steps``: one layer of a model in eval mode; ``model_input``: what
  runs layer by layer and the rows its first layer reads; ``chunks``: a rank's nodes cut into chunks and their
  in-edges; ``halo``: inference from whole layer matrices, own rows then the halo, and where a GPU rank reads them;
  ``matrices``: where the layer
  matrices live (RAM or memory-mapped).
- ``tasks``: the task seam (``InferTask``, ``infer_task``): what the ranks write, the metrics, summary and report,
  whether pairs can be scored, per train task; ``rank_outputs``: a rank's writes per task (torch); ``node``: a node
  classifier's metrics, summary and report; ``link``: a link prediction model's (its encoder: every node's
  embedding, no classes); ``link_eval``: its official metrics from the exact embeddings; ``score``: pairs scored
  from a published build's embeddings by the train artifact's decoder (``gnnpipe score``).
"""
