"""Sites and their images: generators, real layouts, loaders, checks and augmentation."""
